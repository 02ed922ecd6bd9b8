//! The terminal's progress bar: the one adapter from the library's `Progress` reports to indicatif. Off a
//! terminal (a log file, a pipe, a service) the bar is hidden and progress comes as log lines instead: each
//! phase's name, then its count, rate and ETA at every tenth of the phase and at least every half minute.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use longrank::progress::{Progress, Unit};
use parking_lot::Mutex;

pub struct Bar {
    bar: ProgressBar,
    /// Off a terminal: what the log lines need.
    log: Option<Mutex<Log>>,
}

struct Log {
    name: String,
    total: u64,
    unit: Unit,
    started: Instant,
    /// Units done when the phase started (a resumed one's), which its rate leaves out.
    first: u64,
    /// When the last line was printed, and at which tenth of the phase.
    last: Instant,
    tenth: u64,
}

/// A log line at least this often while a phase runs.
const LOG_EVERY: Duration = Duration::from_secs(30);

impl Bar {
    pub fn new() -> Bar {
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return Bar { bar: ProgressBar::new(0), log: None };
        }
        let now = Instant::now();
        let log = Log { name: String::new(), total: 0, unit: Unit::Items, started: now, first: 0, last: now, tenth: 0 };
        Bar { bar: ProgressBar::hidden(), log: Some(Mutex::new(log)) }
    }

    /// A bar with one phase, started at once.
    pub fn counting(total: u64, what: &str) -> Bar {
        let bar = Bar::new();
        bar.phase(what, total, Unit::Items);
        bar
    }

    pub fn inc(&self) {
        self.bar.inc(1);
        self.log_line("");
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Off a terminal: a line when the phase reached a new tenth, or `LOG_EVERY` passed.
    fn log_line(&self, message: &str) {
        let Some(log) = &self.log else { return };
        let mut log = log.lock();
        let done = self.bar.position();
        let tenth = (done * 10).checked_div(log.total).unwrap_or(0);
        if tenth <= log.tenth && log.last.elapsed() < LOG_EVERY {
            return;
        }
        (log.tenth, log.last) = (tenth, Instant::now());
        eprintln!("{}", log.describe(done, message));
    }
}

impl Log {
    /// `name: done/total (p %), rate, ETA; message`.
    fn describe(&self, done: u64, message: &str) -> String {
        let elapsed = self.started.elapsed().as_secs_f64();
        let rate = done.saturating_sub(self.first) as f64 / elapsed.max(1e-9);
        let amount = |n: u64| match self.unit {
            Unit::Items => n.to_string(),
            Unit::Bytes => format!("{:.1} MB", n as f64 / 1e6),
        };
        let mut line = format!("{}: {}", self.name, amount(done));
        if self.total > 0 {
            line += &format!("/{} ({:.0} %)", amount(self.total), 100.0 * done as f64 / self.total as f64);
        }
        line += &match self.unit {
            Unit::Items => format!(", {rate:.1}/s"),
            Unit::Bytes => format!(", {:.1} MB/s", rate / 1e6),
        };
        if self.total > done && rate > 0.0 {
            line += &format!(", ETA {:.0} s", (self.total - done) as f64 / rate);
        }
        if !message.is_empty() {
            line += &format!("; {message}");
        }
        line
    }
}

impl Progress for Bar {
    fn phase(&self, name: &str, total: u64, unit: Unit) {
        self.resume(name, total, unit, 0);
    }

    fn resume(&self, name: &str, total: u64, unit: Unit, done: u64) {
        let counts = match unit {
            Unit::Items => "{pos}/{len}",
            Unit::Bytes => "{bytes}/{total_bytes} {bytes_per_sec}",
        };
        let template = format!("{{prefix}}: {{bar:30}} {counts} · {{msg}} · ETA {{eta}}");
        self.bar.set_style(ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()));
        self.bar.set_length(total);
        self.bar.set_position(done);
        self.bar.reset_eta();
        self.bar.set_prefix(name.to_string());
        if let Some(log) = &self.log {
            let now = Instant::now();
            let tenth = (done * 10).checked_div(total).unwrap_or(0);
            *log.lock() = Log { name: name.to_string(), total, unit, started: now, first: done, last: now, tenth };
            eprintln!("{name}");
        }
    }

    fn set(&self, done: u64, message: &str) {
        self.bar.set_position(done);
        self.bar.set_message(message.to_string());
        self.log_line(message);
    }
}

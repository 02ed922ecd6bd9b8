//! The terminal's progress bar: the one adapter from the library's `Progress` reports to indicatif, hidden
//! when stderr is not a terminal (a hidden bar prints each phase's name once instead).

use indicatif::{ProgressBar, ProgressStyle};
use longrank::progress::{Progress, Unit};

pub struct Bar(ProgressBar);

impl Bar {
    pub fn new() -> Bar {
        let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            ProgressBar::new(0)
        } else {
            ProgressBar::hidden()
        };
        Bar(bar)
    }

    /// A bar with one phase, started at once.
    pub fn counting(total: u64, what: &str) -> Bar {
        let bar = Bar::new();
        bar.phase(what, total, Unit::Items);
        bar
    }

    pub fn inc(&self) {
        self.0.inc(1);
    }

    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}

impl Progress for Bar {
    fn phase(&self, name: &str, total: u64, unit: Unit) {
        let counts = match unit {
            Unit::Items => "{pos}/{len}",
            Unit::Bytes => "{bytes}/{total_bytes} {bytes_per_sec}",
        };
        let template = format!("{{prefix}}: {{bar:30}} {counts} · {{msg}} · ETA {{eta}}");
        self.0.set_style(ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()));
        self.0.set_length(total);
        self.0.set_position(0);
        self.0.reset_eta();
        self.0.set_prefix(name.to_string());
        if self.0.is_hidden() {
            eprintln!("{name}");
        }
    }

    fn set(&self, done: u64, message: &str) {
        self.0.set_position(done);
        self.0.set_message(message.to_string());
    }
}

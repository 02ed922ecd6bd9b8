//! How long jobs report progress: phases with a size, and how far each has come. The library reports through
//! this trait only; the CLI draws it as a terminal bar (`cli::progress`), and a caller that shows nothing
//! passes `Silent`.

/// What a phase counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Things (documents, topics, steps).
    Items,
    /// Bytes read.
    Bytes,
}

pub trait Progress: Sync {
    /// A new phase of `total` units (0: unknown).
    fn phase(&self, name: &str, total: u64, unit: Unit);
    /// Units done so far in the phase, with a short note (a loss, a rate).
    fn set(&self, done: u64, message: &str);
    /// A phase taken up again with `done` units behind it (after another phase interrupted it, or in a resumed
    /// run): its rate counts from here.
    fn resume(&self, name: &str, total: u64, unit: Unit, done: u64) {
        self.phase(name, total, unit);
        self.set(done, "");
    }
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {
    fn phase(&self, _: &str, _: u64, _: Unit) {}
    fn set(&self, _: u64, _: &str) {}
}

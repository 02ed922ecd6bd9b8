//! `longrank collections`: the data directory's collections, and deleting one.

use longrank::config::Config;
use longrank::index::Catalog;

#[derive(clap::Args)]
pub struct CollectionsArgs {
    #[command(flatten)]
    pub global: super::Global,
    #[command(subcommand)]
    action: Option<Action>,
}

#[derive(clap::Subcommand)]
enum Action {
    /// List the collections: documents, mean length, size on disk, and the fingerprint of the index files
    /// (equal on every exact copy: compare it with a replica's `/health`). What no subcommand does too.
    List,
    /// Delete a collection and its index; refused while a queued or running batch job of the server reads it.
    Delete {
        /// The collection to delete.
        name: String,
    },
}

pub fn run(args: CollectionsArgs, config: &Config) -> anyhow::Result<()> {
    match args.action.unwrap_or(Action::List) {
        Action::List => list(config),
        Action::Delete { name } => delete(config, &name),
    }
}

fn list(config: &Config) -> anyhow::Result<()> {
    let collections = super::open_engine(config)?.collections()?;
    if collections.is_empty() {
        eprintln!("no collections in {}", config.data_dir.display());
        return Ok(());
    }
    let width = collections.iter().map(|c| c.name.chars().count()).max().unwrap_or(0).max("collection".len());
    let header = ("collection", "documents", "mean length", "size", "fingerprint");
    println!("{:<width$}  {:>12}  {:>11}  {:>10}  {:<16}", header.0, header.1, header.2, header.3, header.4);
    for c in &collections {
        let fingerprint = c.fingerprint.as_deref().unwrap_or("-");
        println!(
            "{:<width$}  {:>12}  {:>11.1}  {:>10}  {fingerprint:<16}",
            c.name,
            c.documents,
            c.average_length,
            size(c.size_bytes)
        );
    }
    Ok(())
}

/// A size in the unit that shows it with two or three figures (a small collection is kilobytes, not "0.0 MB").
fn size(bytes: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let (mut value, mut unit) = (bytes as f64, 0);
    while value >= 1000.0 && unit + 1 < units.len() {
        (value, unit) = (value / 1000.0, unit + 1);
    }
    match unit {
        0 => format!("{bytes} B"),
        _ if value < 10.0 => format!("{value:.1} {}", units[unit]),
        _ => format!("{value:.0} {}", units[unit]),
    }
}

fn delete(config: &Config, name: &str) -> anyhow::Result<()> {
    let runtime = super::runtime()?;
    let cluster = super::cluster(config, &runtime)?;
    if let Some(super::Cluster::Writer(writer)) = &cluster {
        let task = writer.delete(name)?;
        println!("deleted collection {name} (the cluster's writer, {}, task {})", writer.url(), task["id"]);
        return Ok(());
    }
    let (catalog, _) = Catalog::open(&config.data_dir)?;
    let store = runtime.block_on(super::open_store(config))?;
    // On a cluster replicas delete their copies when they see the deletion.
    let replication = match &cluster {
        Some(super::Cluster::Publish(replication, _writer)) => Some(replication),
        _ => None,
    };
    let (cancel, runtime) = (Default::default(), runtime.handle());
    longrank::scheduler::tasks::delete_collection(&catalog, &store, replication, name, &cancel, runtime)?;
    println!("deleted collection {name}");
    Ok(())
}

//! `longrank index`: documents into a collection.

use std::path::PathBuf;

use anyhow::bail;
use longrank::config::Config;
use longrank::corpus::{Corpus, Format};
use longrank::eval::warnings::counted;
use longrank::index::{self, OnError};

use super::progress::Bar;

#[derive(clap::Args)]
pub struct IndexArgs {
    #[command(flatten)]
    pub global: super::Global,
    /// The collection to build or add to (letters, digits, '-', '_', '.').
    #[arg(long)]
    collection: String,
    /// Input format; auto detects it from each file's content.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    format: Format,
    /// What to do with a malformed document [default: `index.on_error` of the configuration].
    #[arg(long, value_enum)]
    on_error: Option<OnError>,
    /// Rebuild the collection from scratch (the old index serves until the new one is complete).
    #[arg(long)]
    replace: bool,
    /// Files or directories (walked recursively); `.gz` is read transparently.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

pub fn run(args: IndexArgs, mut config: Config) -> anyhow::Result<()> {
    if let Some(on_error) = args.on_error {
        config.index.on_error = on_error;
    }
    let corpus = Corpus::open(&args.paths, args.format)?;
    let runtime = super::runtime()?;
    // Refused before the build when the object store cannot be published to.
    let cluster = super::cluster(&config, &runtime)?;
    if let Some(super::Cluster::Writer(writer)) = &cluster {
        if args.replace {
            bail!("--replace on a cluster a server writes: DELETE the collection there (or `longrank collections delete`), then index");
        }
        let on_error = config.index.on_error;
        for file in corpus.files() {
            let task = writer.upload(&args.collection, file, args.format, on_error)?;
            let documents = &task["documents"];
            println!(
                "{}: applied by the cluster's writer ({}), task {}: indexed {}, skipped {}; published",
                file.display(),
                writer.url(),
                task["id"],
                documents["indexed"],
                documents["skipped"]
            );
        }
        return Ok(());
    }
    let options = config.index.build_options(args.replace);
    let bar = Bar::new();
    let report = index::build(&config.data_dir, &args.collection, &corpus, &options, &bar)?;
    bar.finish();
    println!(
        "collection {}: indexed {}, skipped {} and {}, {} empty, {} read as windows-1252, duplicates {}, \
         {} files already indexed; \
         {} documents in the collection ({:.1} s, {:.0} docs/s, {:.1} MB/s, peak RSS {:.0} MB)",
        report.collection,
        counted(report.indexed as usize, "document"),
        counted(report.skipped as usize, "document"),
        counted(report.skipped_files as usize, "file"),
        report.empty,
        report.guessed_encoding,
        report.duplicates,
        report.files_already_indexed,
        report.documents_in_collection,
        report.elapsed_s,
        report.indexed as f64 / report.elapsed_s.max(1e-9),
        corpus.total_bytes() as f64 / 1e6 / report.elapsed_s.max(1e-9),
        super::bench::peak_rss_mb()
    );
    if let Some(super::Cluster::Publish(replication, _writer)) = cluster {
        super::publish(&replication, &config, &args.collection)?;
    }
    Ok(())
}

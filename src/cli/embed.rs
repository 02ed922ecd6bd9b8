//! `longrank embed`: a bi-encoder's segment embeddings for a whole collection, ahead of queries.

use longrank::config::Config;

use super::progress::Bar;

#[derive(clap::Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub global: super::Global,
    /// The collection [default: the only one, or `default_collection`].
    #[arg(long)]
    collection: Option<String>,
    /// A model name from the configuration [default: the default model].
    #[arg(long = "name")]
    name: Option<String>,
    /// Embed the segments another served model reads (its segmentation and title prefix), for a
    /// `bi-encoder:NAME` preselection in front of it; a segment with no stored embedding is embedded when a
    /// query first needs it, and stored then [default: the bi-encoder's own segments].
    #[arg(long = "for", value_name = "MODEL")]
    for_model: Option<String>,
}

pub fn run(args: EmbedArgs, config: &Config) -> anyhow::Result<()> {
    let engine = super::open_engine(config)?;
    let collection = engine.collection(args.collection.as_deref())?;
    let bar = Bar::counting(collection.num_docs(), "documents");
    let (computed, stored, indexed) =
        engine.embed_collection(&collection, args.name.as_deref(), args.for_model.as_deref(), &bar)?;
    bar.finish();
    let name = collection.name();
    println!(
        "collection {name}: {computed} segment embeddings computed, {stored} stored, {indexed} in the vector index"
    );
    Ok(())
}

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
    // On a cluster: refused before any work when the object store cannot be published to.
    let runtime = super::runtime()?;
    let cluster = super::cluster(config, &runtime)?;
    if let Some(super::Cluster::Writer(writer)) = &cluster {
        let Some(name) = &args.collection else {
            anyhow::bail!("a server writes this cluster ({}): name the collection (--collection)", writer.url());
        };
        let task = writer.embed(name, args.name.as_deref(), args.for_model.as_deref())?;
        println!(
            "collection {name}: embedded by the cluster's writer ({}), task {}; published",
            writer.url(),
            task["id"]
        );
        return Ok(());
    }
    if let Some(super::Cluster::Publish(replication, _)) = &cluster {
        // The newest version is the one to embed and publish again.
        replication.pull_logged(&config.data_dir.join("collections"))?;
    }
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
    if let Some(super::Cluster::Publish(replication, _)) = &cluster {
        super::publish(replication, config, name)?;
    }
    Ok(())
}

//! `longrank search`: one query, a ranking table (with each re-ranked hit's best segment, and how many segments
//! the model read), or the JSON `/search` answers.

use std::io::Write;

use longrank::config::Config;
use longrank::model::Cancel;
use longrank::rank::{Pipeline, RankParams, SearchRequest};

#[derive(clap::Args)]
pub struct SearchArgs {
    #[command(flatten)]
    pub global: super::Global,
    #[command(flatten)]
    params: RankParams,
    /// Results to skip before the k shown (paging: ranks offset + 1 to offset + k). Default: 0.
    #[arg(long)]
    offset: Option<i64>,
    /// Print the response as JSON (as `/search` answers) instead of a table.
    #[arg(long)]
    json: bool,
    /// With --json: every segment's text in `segments`.
    #[arg(long, requires = "json")]
    segment_text: bool,
    /// The query's words.
    #[arg(required = true)]
    query: Vec<String>,
}

/// `model`: the configured model `--model` names, if it names one.
pub fn run(mut args: SearchArgs, model: Option<String>, config: &Config) -> anyhow::Result<()> {
    let engine = super::open_engine(config)?;
    args.params.model = model;
    let request = SearchRequest {
        query: args.query.join(" "),
        params: args.params,
        offset: args.offset,
        segment_text: args.segment_text,
    };
    let response = engine.search(request, &Cancel::default())?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &response)?;
        writeln!(out)?;
    } else if response.results.is_empty() {
        eprintln!("no document of {} matches {:?}", response.collection, response.query);
    } else {
        // Columns as wide as their longest value (docids run long: GOV2's, MS MARCO's).
        let docid = response.results.iter().map(|h| h.docid.chars().count()).max().unwrap_or(0).max("docid".len());
        writeln!(out, "{:>4}  {:>9}  {:<docid$}  title", "rank", "score", "docid")?;
        let first_only = response.pipeline == Pipeline::FirstP;
        let preselect = response.preselect.clone().unwrap_or_default();
        for hit in &response.results {
            writeln!(out, "{:>4}  {:>9.4}  {:<docid$}  {}", hit.rank, hit.score, hit.docid, hit.title)?;
            // A re-ranked hit's evidence: its best segment, and what the model read of the document.
            if let (Some(best), Some(segments)) = (&hit.best_segment, &hit.segments) {
                let read = segments.iter().filter(|s| s.scored).count();
                let note = preselect.read_note(first_only, read, segments.len());
                // The snippet: the best segment around the query's words, on one line.
                let passage = hit.snippet.split_whitespace().collect::<Vec<_>>().join(" ");
                writeln!(out, "{:17}segment {} ({note}): {passage}", "", best.index + 1)?;
            }
            // A dense or hybrid first stage's evidence: where each list ranked the document.
            if let Some(sources) = &hit.first_stages {
                let lists = [("bm25", sources.bm25), ("dense", sources.dense)];
                let listed =
                    lists.iter().filter_map(|(name, l)| l.map(|l| format!("{name} #{} ({:.4})", l.rank, l.score)));
                writeln!(out, "{:17}first stages: {}", "", listed.collect::<Vec<_>>().join(" · "))?;
            }
        }
        if let Some(terms) = &response.expansion {
            let terms: Vec<String> = terms.iter().map(|t| format!("{} {:.3}", t.term, t.weight)).collect();
            eprintln!("RM3 searched with: {}", terms.join(" · "));
        }
    }
    Ok(())
}

//! Retrieval measures exactly as trec_eval 9 computes them: documents ordered by score descending with ties
//! broken by docid descending (the rank column is ignored), relevance = grade >= the relevance level, the
//! `all` row the mean over evaluated topics (counts summed, gm_map a geometric mean).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::formats::{ranked, Qrels, Run, Scored};
use super::EvalError;

/// trec_eval's default cutoffs for P, recall, ndcg_cut and map_cut.
pub const DEFAULT_CUTOFFS: [usize; 9] = [5, 10, 15, 20, 30, 100, 200, 500, 1000];
const SUCCESS_CUTOFFS: [usize; 3] = [1, 5, 10];
/// Recall levels of iprec_at_recall, written as literals so that e.g. 3/10 compares equal to 0.3.
const RECALL_LEVELS: [f64; 11] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
/// trec_eval's floor for the geometric mean.
const MIN_GEO_MEAN: f64 = 0.00001;

/// A family of measures, with cutoffs where it has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    NumQ,
    NumRet,
    NumRel,
    NumRelRet,
    Map,
    GmMap,
    Rprec,
    Bpref,
    RecipRank,
    IprecAtRecall,
    Ndcg,
    P(Vec<usize>),
    Recall(Vec<usize>),
    NdcgCut(Vec<usize>),
    MapCut(Vec<usize>),
    Success(Vec<usize>),
}

impl Measure {
    /// trec_eval's default output (`-m official`).
    pub fn official() -> Vec<Measure> {
        use Measure::*;
        vec![
            NumQ,
            NumRet,
            NumRel,
            NumRelRet,
            Map,
            GmMap,
            Rprec,
            Bpref,
            RecipRank,
            IprecAtRecall,
            P(DEFAULT_CUTOFFS.to_vec()),
        ]
    }

    /// Everything implemented (`-m all_trec`).
    pub fn all() -> Vec<Measure> {
        let mut all = Measure::official();
        let c = DEFAULT_CUTOFFS.to_vec();
        all.extend([
            Measure::Ndcg,
            Measure::Recall(c.clone()),
            Measure::NdcgCut(c.clone()),
            Measure::MapCut(c),
            Measure::Success(SUCCESS_CUTOFFS.to_vec()),
        ]);
        all
    }

    /// Parses trec_eval's `-m` syntax: `map`, `P.5,10,20`, `ndcg_cut.10`, `official`, `all_trec`.
    pub fn parse(spec: &str) -> Result<Vec<Measure>, EvalError> {
        let (name, cutoffs) = match spec.split_once('.') {
            Some((n, c)) => {
                let cutoffs = c
                    .split(',')
                    .map(|x| x.trim().parse::<usize>().ok().filter(|v| *v > 0))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        EvalError::Measure(format!("bad cutoffs in {spec:?}: expected positive integers"))
                    })?;
                (n, Some(cutoffs))
            }
            None => (spec, None),
        };
        let cut = |default: &[usize]| cutoffs.clone().unwrap_or_else(|| default.to_vec());
        let no_cutoffs = |m: Measure| {
            if cutoffs.is_some() {
                Err(EvalError::Measure(format!("{name} takes no cutoffs")))
            } else {
                Ok(vec![m])
            }
        };
        match name {
            "official" => no_cutoffs(Measure::NumQ).map(|_| Measure::official()),
            "all_trec" => no_cutoffs(Measure::NumQ).map(|_| Measure::all()),
            "num_q" => no_cutoffs(Measure::NumQ),
            "num_ret" => no_cutoffs(Measure::NumRet),
            "num_rel" => no_cutoffs(Measure::NumRel),
            "num_rel_ret" => no_cutoffs(Measure::NumRelRet),
            "map" => no_cutoffs(Measure::Map),
            "gm_map" => no_cutoffs(Measure::GmMap),
            "Rprec" => no_cutoffs(Measure::Rprec),
            "bpref" => no_cutoffs(Measure::Bpref),
            "recip_rank" => no_cutoffs(Measure::RecipRank),
            "iprec_at_recall" => no_cutoffs(Measure::IprecAtRecall),
            "ndcg" => no_cutoffs(Measure::Ndcg),
            "P" => Ok(vec![Measure::P(cut(&DEFAULT_CUTOFFS))]),
            "recall" => Ok(vec![Measure::Recall(cut(&DEFAULT_CUTOFFS))]),
            "ndcg_cut" => Ok(vec![Measure::NdcgCut(cut(&DEFAULT_CUTOFFS))]),
            "map_cut" => Ok(vec![Measure::MapCut(cut(&DEFAULT_CUTOFFS))]),
            "success" => Ok(vec![Measure::Success(cut(&SUCCESS_CUTOFFS))]),
            _ => Err(EvalError::Measure(format!(
                "unknown measure {name:?}; known: official, all_trec, num_q, num_ret, num_rel, num_rel_ret, map, \
                 gm_map, Rprec, bpref, recip_rank, iprec_at_recall, ndcg, P, recall, ndcg_cut, map_cut, success"
            ))),
        }
    }

    /// Parses several `-m` arguments; a single column name such as `P_10` or `ndcg_cut_20` is accepted too.
    pub fn parse_all(specs: &[String]) -> Result<Vec<Measure>, EvalError> {
        if specs.is_empty() {
            return Ok(Measure::official());
        }
        let mut out = Vec::new();
        for spec in specs {
            let spec = column_to_spec(spec);
            out.extend(Measure::parse(&spec)?);
        }
        Ok(out)
    }
}

/// `P_10` -> `P.10`, `ndcg_cut_20` -> `ndcg_cut.20` (the column names of trec_eval's output).
fn column_to_spec(spec: &str) -> String {
    if let Some((family, cut)) = spec.rsplit_once('_') {
        if cut.parse::<usize>().is_ok() && ["P", "recall", "ndcg_cut", "map_cut", "success"].contains(&family) {
            return format!("{family}.{cut}");
        }
    }
    spec.to_string()
}

/// trec_eval's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalOptions {
    /// `-l`: the lowest grade that counts as relevant.
    pub relevance_level: i32,
    /// `-M`: evaluate only the first N documents of each topic.
    pub max_docs: Option<usize>,
    /// `-c`: average over every qrels topic (those the run lacks count as empty rankings).
    pub complete: bool,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions { relevance_level: 1, max_docs: None, complete: false }
    }
}

/// Measure values in output order: per topic, and the summary.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub per_topic: BTreeMap<String, Vec<(String, f64)>>,
    pub all: Vec<(String, f64)>,
}

impl Evaluation {
    /// The summary as a map.
    pub fn all_map(&self) -> BTreeMap<String, f64> {
        self.all.iter().cloned().collect()
    }

    /// One measure over topics, for per-topic comparisons.
    pub fn topic_values(&self, measure: &str) -> BTreeMap<String, f64> {
        self.per_topic
            .iter()
            .filter_map(|(q, values)| values.iter().find(|(m, _)| m == measure).map(|(_, v)| (q.clone(), *v)))
            .collect()
    }

    /// trec_eval's three-column output: measure, qid or `all`, value.
    pub fn to_trec_eval(&self, per_topic: bool, run_tag: &str) -> String {
        let line = |name: &str, qid: &str, value: f64| {
            if is_count(name) {
                format!("{name:<22}\t{qid}\t{}\n", value.round() as i64)
            } else {
                format!("{name:<22}\t{qid}\t{value:.4}\n")
            }
        };
        let mut out = String::new();
        if per_topic {
            for (qid, values) in &self.per_topic {
                for (name, value) in values {
                    out.push_str(&line(name, qid, *value));
                }
            }
        }
        out.push_str(&format!("{:<22}\tall\t{run_tag}\n", "runid"));
        for (name, value) in &self.all {
            out.push_str(&line(name, "all", *value));
        }
        out
    }
}

fn is_count(name: &str) -> bool {
    matches!(name, "num_q" | "num_ret" | "num_rel" | "num_rel_ret")
}

/// Evaluates a run against qrels.
pub fn evaluate(run: &Run, qrels: &Qrels, measures: &[Measure], options: EvalOptions) -> Evaluation {
    let empty = Vec::new();
    let qids: Vec<&String> = if options.complete {
        qrels.topics.keys().collect()
    } else {
        qrels.topics.keys().filter(|q| run.topics.contains_key(*q)).collect()
    };
    let mut per_topic = BTreeMap::new();
    for qid in &qids {
        let docs = run.topics.get(*qid).unwrap_or(&empty);
        let mut ranking = ranked(docs);
        if let Some(m) = options.max_docs {
            ranking.truncate(m);
        }
        let values = topic_measures(&ranking, &qrels.topics[*qid], measures, options.relevance_level);
        per_topic.insert((*qid).clone(), values);
    }
    let all = summarize(&per_topic, measures);
    Evaluation { per_topic, all }
}

/// The `all` row: counts summed, gm_map geometric, everything else the arithmetic mean.
fn summarize(per_topic: &BTreeMap<String, Vec<(String, f64)>>, measures: &[Measure]) -> Vec<(String, f64)> {
    let n = per_topic.len() as f64;
    let mut all = Vec::new();
    if measures.contains(&Measure::NumQ) {
        all.push(("num_q".to_string(), n));
    }
    let Some(first) = per_topic.values().next() else { return all };
    for (i, (name, _)) in first.iter().enumerate() {
        let sum: f64 = per_topic.values().map(|v| v[i].1).sum();
        let value = if is_count(name) {
            sum
        } else if name == "gm_map" {
            (sum / n).exp()
        } else {
            sum / n
        };
        all.push((name.clone(), value));
    }
    all
}

/// Every requested measure for one topic, in request order.
fn topic_measures(
    ranking: &[&Scored],
    judged: &HashMap<String, i32>,
    measures: &[Measure],
    level: i32,
) -> Vec<(String, f64)> {
    let grades: Vec<Option<i32>> = ranking.iter().map(|d| judged.get(&d.docid).copied()).collect();
    let rel: Vec<bool> = grades.iter().map(|g| g.is_some_and(|g| g >= level)).collect();
    let num_rel = judged.values().filter(|g| **g >= level).count();
    let num_rel_ret = rel.iter().filter(|r| **r).count();
    let nr = num_rel as f64;
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    // Precision at each relevant document, in rank order.
    let mut precisions = Vec::new();
    let mut rel_so_far = 0usize;
    for (i, r) in rel.iter().enumerate() {
        if *r {
            rel_so_far += 1;
            precisions.push((i, rel_so_far as f64 / (i + 1) as f64));
        }
    }
    let rel_in_top = |k: usize| rel.iter().take(k).filter(|r| **r).count() as f64;
    let ap_at = |k: usize| div(precisions.iter().filter(|(i, _)| *i < k).map(|(_, p)| p).sum(), nr);
    let gains: Vec<f64> = grades.iter().map(|g| g.unwrap_or(0).max(0) as f64).collect();
    let mut ideal: Vec<f64> = judged.values().map(|g| (*g).max(0) as f64).filter(|g| *g > 0.0).collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let dcg =
        |g: &[f64], k: usize| -> f64 { g.iter().take(k).enumerate().map(|(i, g)| g / ((i + 2) as f64).log2()).sum() };
    let ndcg_at = |k: usize| div(dcg(&gains, k), dcg(&ideal, k));

    let mut out = Vec::new();
    for m in measures {
        match m {
            Measure::NumQ => {}
            Measure::NumRet => out.push(("num_ret".into(), ranking.len() as f64)),
            Measure::NumRel => out.push(("num_rel".into(), nr)),
            Measure::NumRelRet => out.push(("num_rel_ret".into(), num_rel_ret as f64)),
            Measure::Map => out.push(("map".into(), ap_at(usize::MAX))),
            Measure::GmMap => out.push(("gm_map".into(), ap_at(usize::MAX).max(MIN_GEO_MEAN).ln())),
            Measure::Rprec => out.push(("Rprec".into(), div(rel_in_top(num_rel), nr))),
            Measure::Bpref => out.push(("bpref".into(), bpref(&grades, judged, level, num_rel))),
            Measure::RecipRank => {
                out.push(("recip_rank".into(), rel.iter().position(|r| *r).map_or(0.0, |i| 1.0 / (i + 1) as f64)))
            }
            Measure::IprecAtRecall => {
                for level in RECALL_LEVELS {
                    // trec_eval's cutoff, in its double arithmetic: the relevant documents the level needs are
                    // (long) (level * R + 0.9), so 0.7 of 3 is 2 (0.7 * 3 + 0.9 = 2.9999999999999996).
                    let needed = (level * nr + 0.9) as usize;
                    let best = precisions
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j + 1 >= needed)
                        .map(|(_, (_, p))| *p)
                        .fold(0.0, f64::max);
                    out.push((format!("iprec_at_recall_{level:.2}"), best));
                }
            }
            Measure::Ndcg => out.push(("ndcg".into(), ndcg_at(usize::MAX))),
            Measure::P(cuts) => cuts.iter().for_each(|k| out.push((format!("P_{k}"), rel_in_top(*k) / *k as f64))),
            Measure::Recall(cuts) => {
                cuts.iter().for_each(|k| out.push((format!("recall_{k}"), div(rel_in_top(*k), nr))))
            }
            Measure::NdcgCut(cuts) => cuts.iter().for_each(|k| out.push((format!("ndcg_cut_{k}"), ndcg_at(*k)))),
            Measure::MapCut(cuts) => cuts.iter().for_each(|k| out.push((format!("map_cut_{k}"), ap_at(*k)))),
            Measure::Success(cuts) => {
                cuts.iter().for_each(|k| out.push((format!("success_{k}"), (rel_in_top(*k) > 0.0) as u8 as f64)))
            }
        }
    }
    out
}

/// trec_eval's bpref: each relevant retrieved document loses the share of judged non-relevant documents
/// ranked above it, with both counts capped at R (the ratio computed in single precision, as trec_eval does).
fn bpref(grades: &[Option<i32>], judged: &HashMap<String, i32>, level: i32, num_rel: usize) -> f64 {
    let num_nonrel = judged.values().filter(|g| **g < level).count();
    let mut nonrel_so_far = 0usize;
    let mut sum = 0.0f64;
    for grade in grades.iter().flatten() {
        if *grade >= level {
            if nonrel_so_far > 0 {
                sum += 1.0 - nonrel_so_far.min(num_rel) as f64 / num_nonrel.min(num_rel) as f64;
            } else {
                sum += 1.0;
            }
        } else {
            nonrel_so_far += 1;
        }
    }
    if num_rel > 0 {
        sum / num_rel as f64
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn eval(run: &str, qrels: &str, m: &str) -> BTreeMap<String, f64> {
        let run = Run::parse(run, Path::new("r")).unwrap();
        let qrels = Qrels::parse(qrels, Path::new("q")).unwrap();
        let measures = Measure::parse_all(&[m.to_string()]).unwrap();
        evaluate(&run, &qrels, &measures, EvalOptions::default()).all_map()
    }

    #[test]
    fn hand_computed_topic() {
        // Ranking: a(rel) b(non) c(rel) d(unjudged); 3 relevant in qrels.
        let run = "1 Q0 a 1 4 t\n1 Q0 b 2 3 t\n1 Q0 c 3 2 t\n1 Q0 d 4 1 t\n";
        let qrels = "1 0 a 1\n1 0 b 0\n1 0 c 2\n1 0 e 1\n";
        let v = eval(run, qrels, "all_trec");
        assert!((v["map"] - (1.0 + 2.0 / 3.0) / 3.0).abs() < 1e-12);
        assert_eq!(v["recip_rank"], 1.0);
        assert_eq!(v["P_5"], 2.0 / 5.0);
        assert!((v["Rprec"] - 2.0 / 3.0).abs() < 1e-12);
        // bpref: a counts 1, c has 1 non-relevant above: 1 - 1/min(1,3) = 0.
        assert!((v["bpref"] - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(v["iprec_at_recall_0.00"], 1.0);
        assert!((v["iprec_at_recall_0.60"] - 2.0 / 3.0).abs() < 1e-12);
        // trec_eval counts 0.7 of 3 relevant documents as 2 (its cutoff arithmetic; checked against trec_eval).
        assert!((v["iprec_at_recall_0.70"] - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(v["iprec_at_recall_0.80"], 0.0);
        let dcg = 1.0 + 2.0 / 4f64.log2();
        let idcg = 2.0 + 1.0 / 3f64.log2() + 1.0 / 4f64.log2();
        assert!((v["ndcg"] - dcg / idcg).abs() < 1e-12);
        assert_eq!((v["num_ret"], v["num_rel"], v["num_rel_ret"]), (4.0, 3.0, 2.0));
        assert_eq!(v["success_1"], 1.0);
    }

    #[test]
    fn ties_are_broken_by_docid_descending() {
        let run = "1 Q0 a 1 1.0 t\n1 Q0 b 2 1.0 t\n";
        assert_eq!(eval(run, "1 0 a 1\n", "recip_rank")["recip_rank"], 0.5);
        assert_eq!(eval(run, "1 0 b 1\n", "recip_rank")["recip_rank"], 1.0);
    }

    #[test]
    fn relevance_level_cutoff_and_complete() {
        let run = Run::parse("1 Q0 a 1 3 t\n1 Q0 b 2 2 t\n1 Q0 c 3 1 t\n", Path::new("r")).unwrap();
        let qrels = Qrels::parse("1 0 a 1\n1 0 c 2\n2 0 x 1\n", Path::new("q")).unwrap();
        let m = Measure::parse_all(&["map".into(), "num_ret".into()]).unwrap();
        let v = |o: EvalOptions| evaluate(&run, &qrels, &m, o).all_map();
        // -l 2: only c is relevant (rank 3).
        assert!((v(EvalOptions { relevance_level: 2, ..Default::default() })["map"] - 1.0 / 3.0).abs() < 1e-12);
        // -M 1: only a is evaluated; half of the relevant documents found at rank 1.
        let cut = v(EvalOptions { max_docs: Some(1), ..Default::default() });
        assert_eq!((cut["map"], cut["num_ret"]), (0.5, 1.0));
        // -c: topic 2 (no results) counts, halving the mean.
        let all = v(EvalOptions { complete: true, ..Default::default() });
        let plain = v(EvalOptions::default());
        assert!((all["map"] - plain["map"] / 2.0).abs() < 1e-12);
    }

    #[test]
    fn measure_syntax() {
        assert_eq!(Measure::parse("P.5,10").unwrap(), vec![Measure::P(vec![5, 10])]);
        assert_eq!(Measure::parse_all(&["ndcg_cut_20".into()]).unwrap(), vec![Measure::NdcgCut(vec![20])]);
        assert!(Measure::parse("map.5").is_err());
        assert!(Measure::parse("P.x").is_err());
        assert!(Measure::parse("nope").is_err());
        assert_eq!(Measure::parse_all(&[]).unwrap(), Measure::official());
    }
}

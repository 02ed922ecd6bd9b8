//! Evaluation against trec_eval's own numbers, and the real TREC topic files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use longrank::eval::{self, EvalOptions, Measure, Qrels, Run, TopicField};

use serde_json::json;

use crate::common::{cli_ok, data, shared};
use crate::fixtures::tiny_cross_encoder;

/// Every row of ../shared/reference/trec_eval/X.expected.tsv, recomputed, agrees to 1e-6.
fn check_reference(name: &str, qrels: &str) {
    let dir = shared().join("reference/trec_eval");
    let run = Run::read(&dir.join(format!("{name}.run"))).unwrap();
    let qrels = Qrels::read(&data(qrels)).unwrap();
    let expected = std::fs::read_to_string(dir.join(format!("{name}.expected.tsv"))).unwrap();
    let mut lines = expected.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let measures = Measure::parse_all(&header[1..].iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let evaluation = eval::evaluate(&run, &qrels, &measures, EvalOptions::default());
    let mut rows = 0;
    for line in lines {
        let cols: Vec<&str> = line.split('\t').collect();
        let got: BTreeMap<String, f64> = if cols[0] == "all" {
            evaluation.all_map()
        } else {
            evaluation
                .per_topic
                .get(cols[0])
                .unwrap_or_else(|| panic!("{name}: topic {} not evaluated", cols[0]))
                .iter()
                .cloned()
                .collect()
        };
        for (measure, value) in header[1..].iter().zip(&cols[1..]) {
            let want: f64 = value.parse().unwrap();
            let have = got[*measure];
            assert!((have - want).abs() <= 1e-6, "{name} {} {measure}: {have} vs trec_eval {want}", cols[0]);
        }
        rows += 1;
    }
    assert_eq!(rows, evaluation.per_topic.len() + 1, "{name}: every evaluated topic has a reference row");
}

#[test]
fn cranfield_graded_qrels_match_trec_eval() {
    check_reference("cranfield.bm25", "cranfield/qrels.txt");
}

#[test]
fn medline_matches_trec_eval() {
    check_reference("medline.bm25", "medline/qrels.txt");
}

#[test]
fn robust04_ties_and_unjudged_documents_match_trec_eval() {
    check_reference("robust04.random-ties", "robust04-topics-qrels/qrels.txt");
}

fn titles(rel: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(data(rel))
        .unwrap()
        .lines()
        .map(|l| {
            let (q, t) = l.split_once('\t').unwrap();
            (q.to_string(), t.to_string())
        })
        .collect()
}

#[test]
fn real_topic_files_parse_with_the_right_ids_and_texts() {
    let robust = eval::read_topics(&data("robust04-topics-qrels/raw/topics.robust04.txt.gz")).unwrap();
    assert_eq!(robust.len(), 250);
    let want = titles("robust04-topics-qrels/topics.tsv");
    for (topic, (qid, title)) in robust.iter().zip(&want) {
        assert_eq!((&topic.qid, &topic.title), (qid, title));
    }
    let desc = titles("robust04-topics-qrels/topics.desc.tsv");
    assert_eq!(robust[0].query(TopicField::Desc), desc[0].1);

    let mut gov2 = Vec::new();
    for f in
        ["topics.terabyte04.701-750.txt.gz", "topics.terabyte05.751-800.txt.gz", "topics.terabyte06.801-850.txt.gz"]
    {
        gov2.extend(eval::read_topics(&data(&format!("gov2-terabyte-topics-qrels/raw/{f}"))).unwrap());
    }
    assert_eq!(gov2.len(), 150);
    let want = titles("gov2-terabyte-topics-qrels/topics.tsv");
    for (topic, (qid, title)) in gov2.iter().zip(&want) {
        assert_eq!((&topic.qid, &topic.title), (qid, title));
    }

    let dl = eval::read_topics(&data("msmarco-doc-dl19-topics-qrels/raw/topics.dl19-doc.txt.gz")).unwrap();
    assert_eq!(dl.len(), 43);
    assert_eq!((dl[0].qid.as_str(), dl[0].title.as_str()), ("156493", "do goldfish grow"));
}

#[test]
fn eval_cli_prints_trec_eval_columns() {
    let dir = tempfile::tempdir().unwrap();
    let reference = shared().join("reference/trec_eval");
    let run: PathBuf = reference.join("cranfield.bm25.run");
    let qrels = data("cranfield/qrels.txt");
    let out = cli_ok(dir.path(), &["eval", run.to_str().unwrap(), qrels.to_str().unwrap()]);
    assert!(out.contains("runid                 \tall\trefbm25\n"), "{out}");
    assert!(out.contains("num_q                 \tall\t225\n"), "{out}");
    assert!(out.contains("map                   \tall\t0.2693\n"), "{out}");
    assert!(out.contains("iprec_at_recall_0.50"), "{out}");
    assert!(out.contains("P_1000"), "{out}");
    let out = cli_ok(
        dir.path(),
        &["eval", "-q", "-m", "ndcg_cut.10", "-m", "P.5", run.to_str().unwrap(), qrels.to_str().unwrap()],
    );
    assert!(out.contains("ndcg_cut_10           \t1\t0.4126\n"), "{out}");
    assert!(out.contains("P_5                   \tall\t0.3040\n"), "{out}");
    assert!(!out.contains("map"), "{out}");
}

#[test]
fn compare_and_folds_cli() {
    let dir = tempfile::tempdir().unwrap();
    let reference = shared().join("reference/trec_eval");
    let run = reference.join("cranfield.bm25.run");
    let run = run.to_str().unwrap();
    let qrels = data("cranfield/qrels.txt");
    // A run compared with itself: no difference, every topic a tie, p = 1.
    let out = cli_ok(dir.path(), &["compare", "-m", "map", run, run, qrels.to_str().unwrap()]);
    let row = out.lines().find(|l| l.starts_with("map ")).unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("+0.0000") && row.contains("1.0000") && row.ends_with("0/225/0"), "{row}");

    let folds = dir.path().join("folds.tsv");
    let topics = data("cranfield/topics.tsv");
    cli_ok(
        dir.path(),
        &["folds", "--topics", topics.to_str().unwrap(), "-k", "5", "--seed", "7", "--out", folds.to_str().unwrap()],
    );
    let made = eval::read_folds(&folds).unwrap();
    assert_eq!(made.len(), 225);
    assert!(made.values().all(|f| *f < 5));
    let out = cli_ok(dir.path(), &["folds", "--read", folds.to_str().unwrap()]);
    assert_eq!(out.lines().count(), 5, "{out}");
    assert!(out.contains("fold 0\t45 topics"), "{out}");
    // The shared SQuAD folds read as they are.
    let squad = eval::read_folds(&data("squad-v1.1-dev-articles/folds.tsv")).unwrap();
    assert!(squad.len() > 10_000);
}

#[test]
fn segment_selection_is_measured_against_gold_passages() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 17);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sentence = |i: usize| format!("Sentence number {i} talks about rivers and mountains in the north.");
    let text: String = (0..12).map(sentence).collect::<Vec<_>>().join(" ");
    let docs = [json!({"docid": "a", "title": "A", "text": text}), json!({"docid": "b", "title": "B", "text": text})];
    let docs: String = docs.iter().map(|d| format!("{d}\n")).collect();
    std::fs::write(d.join("docs.jsonl"), docs).unwrap();
    std::fs::write(d.join("topics.tsv"), "q1\trivers in the north\nq2\tmountains\nq3\tno passage\n").unwrap();
    // q1's passage is the first sentence (in the first segment); q2's the last (never the first segment).
    let last = text.len() - sentence(11).len();
    std::fs::write(d.join("passages.tsv"), format!("q1\ta\t0\t20\nq2\tb\t{last}\t{}\n", text.len())).unwrap();
    crate::common::cli_ok(d, &["index", "--collection", "c", d.join("docs.jsonl").to_str().unwrap()]);
    let args = [
        "--model",
        models.path().to_str().unwrap(),
        "eval-segments",
        "--topics",
        "topics.tsv",
        "--passages",
        "passages.tsv",
    ];
    let out = crate::common::cli_ok(d, &args);
    let value = |name: &str| crate::common::tsv_value(&out, name);
    assert_eq!(value("questions"), 2.0, "{out}");
    assert!(value("segments_per_document") > 2.0, "{out}");
    assert_eq!(value("p1_first"), 0.5, "{out}");
    let random = value("p1_random");
    assert!(random > 0.0 && random < 0.5, "{out}");
    assert!((0.0..=1.0).contains(&value("p1_model")));
    assert!(!out.contains("best_recall"), "no preselection: {out}");
    // Preselected: every segment read is full MaxP (its best always among them); the first one only, P@1 is
    // the first segment's, and the best of every segment is not always the first.
    let preselected = |json: &str| crate::common::cli_ok(d, &[&args[..], &["--preselect", json]].concat());
    let all = preselected(r#"{"selector": "bm25", "per_doc": 1000}"#);
    assert_eq!(crate::common::tsv_value(&all, "best_recall"), 1.0, "{all}");
    assert_eq!(crate::common::tsv_value(&all, "p1_model"), value("p1_model"), "{all}");
    let first = preselected(r#"{"selector": "bm25", "per_doc": 1, "keep_first": true}"#);
    assert_eq!(crate::common::tsv_value(&first, "p1_model"), 0.5, "{first}");
    assert!(crate::common::tsv_value(&first, "best_recall") <= 0.5, "{first}");
    std::fs::write(d.join("passages.tsv"), "q1\ta\tzero\t20\n").unwrap();
    let failed = crate::common::cli(d, &args);
    assert!(String::from_utf8_lossy(&failed.stderr).contains("passages.tsv:1: bad offset"));
}

/// Every measure longrank computes (`all_trec`), per topic and on the `all` line, against trec_eval itself (its
/// C code, through PyPI's pytrec-eval-terrier): BM25 and BM25+RM3 runs of cranfield, medline, cacm and time, and
/// the reference runs. Values are compared as computed, not as printed.
#[test]
fn every_measure_equals_trec_eval_itself_on_four_collections() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut checked = 0;
    for collection in ["cranfield", "medline", "cacm", "time"] {
        let (docs, topics, qrels) = (
            data(&format!("{collection}/docs.jsonl")),
            data(&format!("{collection}/topics.tsv")),
            data(&format!("{collection}/qrels.txt")),
        );
        cli_ok(d, &["index", "--collection", collection, docs.to_str().unwrap()]);
        for pipeline in ["bm25", "bm25+rm3"] {
            let run = d.join(format!("{collection}.{pipeline}.run"));
            let args =
                ["batch", "--collection", collection, "--topics", topics.to_str().unwrap(), "--pipeline", pipeline];
            cli_ok(d, &[&args[..], &["-k", "1000", "--out", run.to_str().unwrap()]].concat());
            checked += same_as_trec_eval(&run, &qrels);
        }
    }
    let reference = shared().join("reference/trec_eval");
    for (name, qrels) in [
        ("cranfield.bm25", "cranfield/qrels.txt"),
        ("medline.bm25", "medline/qrels.txt"),
        ("robust04.random-ties", "robust04-topics-qrels/qrels.txt"),
    ] {
        checked += same_as_trec_eval(&reference.join(format!("{name}.run")), &data(qrels));
    }
    assert!(checked > 60_000, "{checked} values compared");
}

/// Compares every per-topic value and the `all` line; returns how many values were compared.
fn same_as_trec_eval(run_path: &std::path::Path, qrels_path: &std::path::Path) -> usize {
    let reference: BTreeMap<String, BTreeMap<String, f64>> = serde_json::from_str(&crate::common::python_script(
        "trec_eval.py",
        &[run_path.to_str().unwrap(), qrels_path.to_str().unwrap()],
    ))
    .unwrap();
    let run = Run::read(run_path).unwrap();
    let qrels = Qrels::read(qrels_path).unwrap();
    let ours = eval::evaluate(&run, &qrels, &Measure::all(), EvalOptions::default());
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    let mut compared = 0;
    assert_eq!(ours.per_topic.len(), reference.len(), "{}: topics evaluated", run_path.display());
    for (qid, values) in &ours.per_topic {
        let theirs = &reference[qid];
        for (measure, value) in values {
            let want = theirs.get(measure).unwrap_or_else(|| panic!("trec_eval has no {measure}"));
            assert!(
                close(*value, *want),
                "{} topic {qid} {measure}: {value} vs trec_eval's {want}",
                run_path.display()
            );
            compared += 1;
        }
    }
    // The `all` line: counts summed, gm_map geometric, the rest the mean over topics.
    let n = reference.len() as f64;
    for (measure, value) in ours.all_map() {
        let per_topic = reference.values().map(|v| v.get(&measure).copied().unwrap_or(0.0));
        let want = match measure.as_str() {
            "num_q" => n,
            "num_ret" | "num_rel" | "num_rel_ret" => per_topic.sum(),
            "gm_map" => (per_topic.sum::<f64>() / n).exp(),
            _ => per_topic.sum::<f64>() / n,
        };
        assert!(close(value, want), "{} all {measure}: {value} vs trec_eval's {want}", run_path.display());
        compared += 1;
    }
    compared
}

//! The command line explains itself: every option described with its default, one-line user errors, plain
//! text when not on a terminal, aligned tables, empty results said, and `longrank collections`.

use std::process::Command;

use serde_json::json;

use crate::common::{cli, cli_env, cli_ok, data, post_json, TestServer, BIN};

fn help(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).arg("-h").output().unwrap();
    assert!(out.status.success(), "{args:?} -h");
    String::from_utf8(out.stdout).unwrap()
}

/// Every subcommand (bench's included), from the top-level help.
fn subcommands() -> Vec<Vec<String>> {
    let top = help(&[]);
    let commands = top.split("Commands:").nth(1).unwrap().split("Options:").next().unwrap();
    let mut all = Vec::new();
    for name in commands.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| *n != "help") {
        let sub = help(&[name]);
        match sub.split("Commands:").nth(1) {
            Some(nested) => {
                let nested = nested.split("Options:").next().unwrap();
                for inner in nested.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| *n != "help") {
                    all.push(vec![name.to_string(), inner.to_string()]);
                }
            }
            None => all.push(vec![name.to_string()]),
        }
    }
    all
}

#[test]
fn every_option_of_every_subcommand_says_what_it_does_and_its_default() {
    let commands = subcommands();
    assert!(commands.len() >= 15, "{commands:?}");
    let mut missing = Vec::new();
    for command in &commands {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        let text = help(&args);
        let usage = text.split("Usage:").nth(1).unwrap().lines().next().unwrap().to_string();
        let options: Vec<&str> = text.split("Options:").nth(1).unwrap_or_default().lines().collect();
        for (i, line) in options.iter().enumerate().filter(|(_, l)| l.trim_start().starts_with('-')) {
            // `  -k, --k <K>    text`: the flags, then the description after two spaces or more, or (clap's
            // long layout) on the lines below, up to a blank line.
            let (flags, same_line) = line.trim_start().split_once("  ").unwrap_or((line.trim(), ""));
            let below =
                options[i + 1..].iter().take_while(|l| !l.trim().is_empty() && !l.trim_start().starts_with('-'));
            let description = std::iter::once(same_line).chain(below.copied()).collect::<Vec<_>>().join(" ");
            let name = flags.split([',', ' ']).rfind(|f| f.starts_with('-')).unwrap_or(flags);
            if ["-h", "--help", "-V", "--version"].contains(&name) {
                continue;
            }
            let description = description.trim();
            let takes_value = flags.contains('<');
            let required = usage.contains(&format!("{name} <"));
            let says_default = description.to_lowercase().contains("default") || description.contains("either");
            if description.is_empty() || (takes_value && !required && !says_default) {
                missing.push(format!("{} {name}: {description:?}", command.join(" ")));
            }
        }
    }
    assert!(missing.is_empty(), "options without a description or their default:\n{}", missing.join("\n"));
    // The commands that read neither the configuration's models nor the data directory do not offer them.
    for command in ["eval", "compare", "folds"] {
        let text = help(&[command]);
        assert!(!text.contains("--model") && !text.contains("--data-dir"), "{command}: {text}");
    }
    // The pipelines are named where they are chosen.
    for command in ["search", "batch"] {
        assert!(help(&[command]).contains("bm25, bm25+rm3, firstp, maxp, sump, avgp, cobert"), "{command}");
    }
}

#[test]
fn user_errors_are_one_line_without_colour_or_backtrace() {
    let dir = crate::fixtures::cranfield_data_dir();
    let missing = dir.path().join("no-such-topics.tsv");
    let out = cli_env(
        dir.path(),
        &["batch", "--collection", "cranfield", "--topics", missing.to_str().unwrap(), "--out", "x.run"],
        &[("RUST_BACKTRACE", "1"), ("RUST_LOG", "info")],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| !l.contains(" INFO ") && !l.contains(" WARN ")).collect();
    assert_eq!(errors.len(), 1, "one line: {stderr}");
    assert!(errors[0].starts_with("error: ") && errors[0].matches("no-such-topics.tsv").count() == 1, "{stderr}");
    // A file named once, in every command that reads one (issue 56 item 6: `error: qrels.txt: qrels.txt: …`).
    std::fs::write(dir.path().join("x.run"), "1 Q0 d 1 1.0 r\n").unwrap();
    for args in [&["eval", "x.run", "no-such-qrels.txt"][..], &["eval", "no-such.run", "x.run"]] {
        let out = cli_env(dir.path(), args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let named = args[1..].iter().find(|f| f.starts_with("no-such")).unwrap();
        assert!(!out.status.success() && stderr.matches(named).count() == 1, "{args:?}: {stderr}");
    }
    assert!(!stderr.contains("backtrace") && !stderr.contains('\u{1b}'), "no backtrace, no colour codes: {stderr:?}");
}

#[test]
fn search_tables_align_long_docids_and_say_when_nothing_matches() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs.jsonl");
    let long = "clueweb12-0000tw-05-12114-with-a-very-long-suffix";
    std::fs::write(
        &docs,
        format!(
            "{}\n{}\n",
            json!({"id": "d1", "title": "Tides", "text": "tides and the moon"}),
            json!({"id": long, "title": "Moon", "text": "the moon and tides again, tides"})
        ),
    )
    .unwrap();
    cli_ok(dir.path(), &["index", "--collection", "c", docs.to_str().unwrap()]);
    let table = cli_ok(dir.path(), &["search", "--collection", "c", "tides"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let title_at = lines[0].find("title").unwrap();
    for line in &lines[1..] {
        let title = if line.contains(long) { "Moon" } else { "Tides" };
        assert_eq!(line.find(title), Some(title_at), "aligned:\n{table}");
    }
    let out = cli(dir.path(), &["search", "--collection", "c", "zebras"]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "no document of c matches \"zebras\"");
}

#[test]
fn collections_are_listed_and_deleted_but_not_under_a_running_job() {
    let dir = crate::fixtures::cranfield_data_dir();
    let d = dir.path();
    cli_ok(d, &["index", "--collection", "time", data("trec-format-samples/time/time.trec.gz").to_str().unwrap()]);
    let list = cli_ok(d, &["collections"]);
    let names: Vec<&str> = list.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(names, ["cranfield", "time"], "{list}");
    assert!(list.lines().nth(1).unwrap().contains("1398"), "Cranfield less its 2 empty documents: {list}");
    // The fingerprint the server shows for the same files.
    let fingerprint = list.lines().nth(1).unwrap().split_whitespace().last().unwrap().to_string();
    let server = TestServer::start(d, &[]).wait_ready();
    let (_, health) = crate::common::get(&server.url("/health"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&health).unwrap()["fingerprints"]["cranfield"],
        fingerprint.as_str()
    );
    drop(server);

    // A job held after its first topic reads cranfield: deleting it is refused, naming the job.
    let release = d.join("release");
    let hold = format!("batch.topic:1:{}", release.display());
    let server = TestServer::start(d, &[("LONGRANK_TEST_HOLD", hold.as_str())]).wait_ready();
    let body = json!({"collection": "cranfield", "topics": "1\twing flutter\n2\theat transfer\n"});
    let id = post_json(&server.url("/batch"), &body.to_string()).json()["id"].as_str().unwrap().to_string();
    let held = crate::common::wait_for_job(&server, &id, |v| v["progress"]["done"] == 1);
    assert!(held["progress"]["eta_s"].as_f64().is_some_and(|s| s >= 0.0), "a running job's ETA: {held}");
    let out = cli(d, &["collections", "delete", "cranfield"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("collection cranfield is in use by batch jobs {id}")), "{stderr}");
    assert!(d.join("collections/cranfield").is_dir());
    std::fs::write(&release, "").unwrap();
    crate::common::wait_for_job(&server, &id, |v| v["status"] == "done");
    drop(server);

    assert_eq!(cli_ok(d, &["collections", "delete", "cranfield"]).trim(), "deleted collection cranfield");
    assert!(!d.join("collections/cranfield").exists());
    let list = cli_ok(d, &["collections", "list"]);
    assert_eq!(list.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect::<Vec<_>>(), ["time"]);
    let out = cli(d, &["collections", "delete", "cranfield"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cranfield"), "an unknown collection is named");
}

/// `longrank search` shows a re-ranked hit's evidence without `--json`: its best segment and how many segments
/// the model read; errors name their cause once, and `serve` on a busy port names the address.
#[test]
fn search_shows_evidence_and_errors_say_each_cause_once() {
    let models = tempfile::tempdir().unwrap();
    crate::fixtures::tiny_cross_encoder(models.path(), 5);
    let dir = crate::fixtures::gov2_data_dir();
    let d = dir.path();
    let args = ["--model", models.path().to_str().unwrap(), "search", "--pipeline", "maxp", "-k", "3", "oil industry"];
    let table = cli_ok(d, &args);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 1 + 2 * 3, "a line of evidence under each hit:\n{table}");
    let json = cli_ok(d, &[&args[..], &["--json"]].concat());
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    for (hit, line) in json["results"].as_array().unwrap().iter().zip(lines[1..].chunks(2)) {
        let segments = hit["segments"].as_array().unwrap();
        let read = segments.iter().filter(|s| s["scored"] == true).count();
        let who = if read < segments.len() { ", BM25 preselection" } else { "" };
        let note = format!(
            "segment {} ({read} of {} segments read{who}): ",
            hit["best_segment"]["index"].as_u64().unwrap() + 1,
            segments.len()
        );
        assert!(line[1].trim_start().starts_with(&note), "{:?} does not start with {note:?}", line[1]);
        let words: Vec<&str> = hit["snippet"].as_str().unwrap().split_whitespace().collect();
        assert!(line[1].ends_with(&words.join(" ")), "{}", line[1]);
    }
    assert_eq!(json["preselect"]["selector"], "bm25", "{json}");

    let missing = cli(d, &["index", "--collection", "x", "/no/such/file.jsonl"]);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && stderr.matches("No such file").count() == 1, "{stderr}");
    assert!(stderr.contains("/no/such/file.jsonl"), "{stderr}");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = cli(d, &["serve", "--addr", &addr]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(&format!("listening on {addr}")), "{stderr}");
}

/// Off a terminal (the tests' stderr is a pipe) long commands report progress as log lines: each phase's name,
/// then its count, percentage, rate and ETA at every tenth.
#[test]
fn progress_comes_as_log_lines_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = cli(d, &["index", "--collection", "cranfield", data("cranfield/docs.jsonl").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.lines().any(|l| l == "indexing cranfield"), "{stderr}");
    assert!(
        stderr.lines().filter(|l| l.starts_with("indexing cranfield: ") && l.contains(" %)")).count() >= 3,
        "{stderr}"
    );
    let topics = data("cranfield/topics.tsv");
    let out = d.join("run");
    let args = ["batch", "--collection", "cranfield", "--topics", topics.to_str().unwrap(), "--out"];
    let batch = cli(d, &[&args[..], &[out.to_str().unwrap()]].concat());
    let stderr = String::from_utf8_lossy(&batch.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("topics: ")).collect();
    assert_eq!(lines.len(), 10, "a line at each tenth: {stderr}");
    assert!(lines[0].starts_with("topics: 23/225 (10 %), ") && lines[0].contains("/s, ETA "), "{}", lines[0]);
    assert!(lines[9].starts_with("topics: 225/225 (100 %), "), "{}", lines[9]);
}

/// What README's commands write in the repository (`runs/`, training's checkpoints) is git-ignored (issue 56 item 6).
#[test]
fn what_readme_commands_write_in_the_repository_is_ignored() {
    for path in ["runs/best/best-1/model/model.safetensors", "data/longrank.db"] {
        let ignored = std::process::Command::new("git")
            .args(["check-ignore", "-q", path])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(ignored.success(), "{path} is not git-ignored");
    }
}

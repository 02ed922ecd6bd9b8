//! The web page in a real headless Chromium, driven over WebDriver (chromedriver): search with segment
//! evidence, the document view's highlight, and a batch run to its metrics. A failing test leaves a
//! screenshot in `target/tmp/browser-*.png`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{cli_ok, data, post_json, Browser, TestServer};

/// The first screen where the default model cannot be had (a hub id, the hub unreachable): one quiet line says
/// re-ranking is off and what to do, the server's reason a click away, and BM25 search works.
#[test]
fn the_first_screen_without_the_default_model_is_one_line_and_search_works() {
    let dir = crate::fixtures::cranfield_data_dir();
    let hf_home = tempfile::tempdir().unwrap();
    let env = [
        ("LONGRANK_MODEL_PATH", "cross-encoder/ms-marco-MiniLM-L6-v2"),
        ("HF_HOME", hf_home.path().to_str().unwrap()),
        ("HF_ENDPOINT", "http://127.0.0.1:9"),
        ("HF_HUB_OFFLINE", "0"),
    ];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let browser = Browser::start("offline");
    browser.goto(&server.url("/"));
    browser.wait_for("#model-notice:not([hidden])");
    let shown = browser.script(
        "return [document.getElementById('model-summary').textContent, document.getElementById('model-notice').open, \
         document.getElementById('status').className, document.getElementById('model-details').textContent]",
    );
    assert_eq!(
        shown[0],
        "Re-ranking off: the default model is not in the hub cache and could not be fetched: start with --model DIR. \
         BM25 search works."
    );
    assert_eq!((&shown[1], &shown[2]), (&json!(false), &json!("")), "closed, and not an error: {shown}");
    let details = shown[3].as_str().unwrap();
    assert!(
        details.starts_with("default (cross-encoder/ms-marco-MiniLM-L6-v2): ") && details.contains("point --model"),
        "{details}"
    );
    assert!(!browser.displayed(&browser.find_all("#model-details")[0]), "the details wait for a click");
    browser.click(&browser.find_all("#model-summary")[0]);
    assert!(browser.displayed(&browser.find_all("#model-details")[0]));
    browser.goto(&server.url("/?q=wing+flutter"));
    browser.wait_for("#results li");
    let status = browser.text(&browser.find_all("#status")[0]);
    assert!(status.starts_with("10 results from cranfield, bm25."), "{status}");
}

#[test]
fn search_shows_segment_evidence_and_the_best_segment_in_the_document() {
    let models = tempfile::tempdir().unwrap();
    crate::fixtures::tiny_cross_encoder(models.path(), 23);
    let dir = tempfile::tempdir().unwrap();
    let gov2 = data("trec-format-samples/gov2-style/GX000");
    cli_ok(dir.path(), &["index", "--collection", "gov2", gov2.to_str().unwrap()]);
    let server =
        TestServer::start(dir.path(), &[("LONGRANK_MODEL_PATH", models.path().to_str().unwrap())]).wait_ready();
    let browser = Browser::start("search");

    browser.goto(&server.url("/"));
    let query = browser.wait_for("#q")[0].clone();
    browser.wait_for("#pipeline option[value=maxp]");
    browser.script("const s = document.getElementById('pipeline'); s.value = 'maxp';");
    // U+E007 is WebDriver's Enter key.
    browser.type_into(&query, "oil industry history\u{E007}");
    let results = browser.wait_for("#results li[data-docid]");
    // A server without keys never asks for one.
    assert!(!browser.displayed(&browser.find_all("#key-form")[0]), "the key form shows on a keyless server");
    let expected = post_json(
        &server.url("/search"),
        r#"{"query": "oil industry history", "pipeline": "maxp", "k": 10, "depth": 20, "segment_text": true}"#,
    )
    .json();
    let hits = expected["results"].as_array().unwrap();
    assert_eq!(results.len(), hits.len());
    let docids = browser.script("return [...document.querySelectorAll('#results li')].map(li => li.dataset.docid)");
    let want: Vec<Value> = hits.iter().map(|h| h["docid"].clone()).collect();
    assert_eq!(docids.as_array().unwrap(), &want);
    // The strip shows every segment (one button each, or groups of them past 40), and the passage shown first
    // is the best segment.
    let first = &hits[0];
    let count = first["segments"].as_array().unwrap().len();
    let shown = browser.script(
        "return [document.querySelectorAll('#results li:first-child .strip.overview .group').length, \
         document.querySelectorAll('#results li:first-child .strip:not(.overview):not(.zoom) .seg').length]",
    );
    let expected = if count > 40 { json!([count.div_ceil(count.div_ceil(40)), 0]) } else { json!([0, count]) };
    assert_eq!(shown, expected, "{count} segments");
    // Segments the model did not read (by default MaxP reads each candidate's two best by BM25) are hatched, one
    // button each in the strips of documents of 40 segments or fewer.
    let hatched = browser.script(
        "return [...document.querySelectorAll('#results li')].map(li => \
         li.querySelectorAll('.strip:not(.overview):not(.zoom) .seg.unscored').length)",
    );
    let unread: Vec<usize> = hits
        .iter()
        .map(|h| h["segments"].as_array().unwrap())
        .map(|segments| if segments.len() > 40 { 0 } else { segments.iter().filter(|s| s["scored"] == false).count() })
        .collect();
    assert_eq!(hatched, json!(unread));
    assert!(unread.iter().sum::<usize>() > 0, "some segments go unread: {unread:?}");
    // Each hit says how many segments the model read, and who chose them.
    let notes = browser.script("return [...document.querySelectorAll('#results li .meta')].map(m => m.textContent)");
    for (note, hit) in notes.as_array().unwrap().iter().zip(hits) {
        let segments = hit["segments"].as_array().unwrap();
        let read = segments.iter().filter(|s| s["scored"] == true).count();
        let who = if read < segments.len() { ", BM25 preselection" } else { "" };
        let expected = format!("{read} of {} segments read{who}", segments.len());
        assert!(note.as_str().unwrap().ends_with(&expected), "{note} does not end with {expected}");
    }
    let strip = browser.find_all("#results li:first-child .strip .seg");
    let passage_text = || {
        let shown = browser
            .script("return document.querySelector('#results li:first-child .passage span:last-child').textContent");
        shown.as_str().unwrap().to_string()
    };
    let best_text = first["best_segment"]["text"].as_str().unwrap();
    assert_eq!(passage_text(), best_text);
    // Clicking another segment shows its text.
    if strip.len() > 1 {
        let indices = browser.script(
            "return [...document.querySelectorAll('#results li:first-child .strip .seg')].map(b => Number(b.dataset.index))",
        );
        let at = indices.as_array().unwrap().iter().position(|i| *i != first["best_segment"]["index"]).unwrap();
        let other = &first["segments"][indices[at].as_u64().unwrap() as usize];
        browser.click(&strip[at]);
        assert_eq!(passage_text(), other["text"].as_str().unwrap());
    }
    // The title opens the document with the best segment highlighted (byte offsets turned into UTF-16).
    let title = browser.find_all("#results li:first-child .title")[0].clone();
    browser.click(&title);
    let best = browser.wait_for("#doc-text mark.best")[0].clone();
    let shown = browser.script("return document.getElementById('best-segment').textContent");
    assert_eq!(shown.as_str().unwrap(), best_text);
    assert!(!browser.text(&best).is_empty());
    // The document view has a URL of its own; Back returns to the results (not run again), and that URL
    // opened afresh shows the document.
    let doc_url = browser.script("return location.href").as_str().unwrap().to_string();
    assert!(doc_url.contains(&format!("doc={}", first["docid"].as_str().unwrap())), "{doc_url}");
    browser.script("window.__searches = 0; const f = window.fetch; window.fetch = (...a) => { if (String(a[0]).startsWith('/search')) window.__searches++; return f(...a); };");
    browser.call("POST", "/back", Some(json!({})));
    browser.wait_for("#document[hidden]");
    let state = browser.script(
        "return [location.search.includes('doc='), document.getElementById('results').hidden,          document.querySelectorAll('#results li').length, window.__searches]",
    );
    assert_eq!(state, json!([false, false, hits.len(), 0]), "back from the document");
    browser.goto(&doc_url);
    browser.wait_for("#document:not([hidden]) #doc-text mark.best");
    // "Back to results" does the same.
    browser.click(&browser.find_all("#close")[0]);
    browser.wait_for("#document[hidden]");
    assert!(!browser.script("return location.search").as_str().unwrap().contains("doc="));
    // The URL holds the search, and the back button returns to the previous one.
    let url = browser.script("return location.search").as_str().unwrap().to_string();
    assert!(url.contains("q=oil+industry+history") && url.contains("pipeline=maxp"), "{url}");
    let query = browser.find_all("#q")[0].clone();
    browser.call("POST", &format!("/element/{query}/clear"), Some(json!({})));
    browser.type_into(&query, "pearls\u{E007}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !browser.script("return location.search").as_str().unwrap().contains("q=pearls") {
        assert!(Instant::now() < deadline, "the second search never reached the URL");
        std::thread::sleep(Duration::from_millis(50));
    }
    browser.call("POST", "/back", Some(json!({})));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = browser
            .script("return [document.getElementById('q').value, document.querySelectorAll('#results li').length]");
        if shown[0] == "oil industry history" && shown[1] == hits.len() {
            break;
        }
        assert!(Instant::now() < deadline, "back did not restore the first search: {shown}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The preselection is the page's to choose, kept in the URL: every segment read (each strip without a hatched
    // segment, the passage labelled "Best segment"), then BM25's best one per document ("Best segment read"),
    // with a legend for the strip.
    let read = |url: &str| {
        browser.goto(&server.url(url));
        browser.wait_for("#results li[data-docid]");
        browser.script(
            "return [document.getElementById('read').value, document.querySelectorAll('#results .seg.unscored').length, \
             [...document.querySelectorAll('#results li .seg:not(.unscored)')].length, \
             (document.querySelector('#results li:has(.unscored) .passage-label') || \
             document.querySelector('#results li .passage-label')).textContent, \
             !document.getElementById('legend').hidden, !document.getElementById('per-doc-label').hidden]",
        )
    };
    let every = read("/?q=oil+industry+history&pipeline=maxp&read=every");
    assert_eq!((&every[0], &every[1], &every[4], &every[5]), (&json!("every"), &json!(0), &json!(true), &json!(false)));
    assert!(every[3].as_str().unwrap().starts_with("Best segment "), "{every}");
    let one = read("/?q=oil+industry+history&pipeline=maxp&read=bm25&per_doc=1");
    assert_eq!((&one[0], &one[2], &one[5]), (&json!("bm25"), &json!(hits.len()), &json!(true)), "one read each: {one}");
    assert!(one[3].as_str().unwrap().starts_with("Best segment read "), "{one}");
    // Chosen in the form, the choice goes to the URL.
    browser.script("document.getElementById('read').value = 'every'; document.getElementById('read').dispatchEvent(new Event('change'))");
    browser.click(&browser.find_all("#search button[type=submit]")[0]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !browser.script("return location.search").as_str().unwrap().contains("read=every") {
        assert!(Instant::now() < deadline, "the choice never reached the URL");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!browser.script("return location.search").as_str().unwrap().contains("per_doc"), "per_doc only with bm25");

    // An error is the server's message, not a stack trace.
    browser.goto(&server.url("/?q=oil&k=100000"));
    browser.wait_for("#status.error");
    let status = browser.script("return document.getElementById('status').textContent");
    assert!(status.as_str().unwrap().contains("k must be between 1 and"), "{status}");
}

/// What the page says about a search: every pipeline in the menu (depth and the model menu only for those that
/// re-rank), the model by name and source, RM3's expanded query, result counts in words, and a strip of many
/// segments as groups with a zoom.
#[test]
fn the_page_explains_pipelines_models_expansion_and_long_strips() {
    let models = tempfile::tempdir().unwrap();
    let (one, other) = (models.path().join("one"), models.path().join("other"));
    crate::fixtures::tiny_cross_encoder(&one, 31);
    crate::fixtures::tiny_cross_encoder(&other, 37);
    let dir = tempfile::tempdir().unwrap();
    let gov2 = data("trec-format-samples/gov2-style/GX000");
    cli_ok(dir.path(), &["index", "--collection", "gov2", gov2.to_str().unwrap()]);
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\npath = {:?}\n[model.named]\nother = {:?}\n[model.segments]\nstrategy = \"windows\"\nwords = 8\nstride = 8\n\
             [model.preselect]\nselector = \"none\"\n",
            one.to_str().unwrap(),
            other.to_str().unwrap()
        ),
    )
    .unwrap();
    // The harness sets LONGRANK_MODEL_PATH (to none); the same model as the file's. Every segment read: the
    // strips below are of scores.
    let env = [("LONGRANK_CONFIG", config.to_str().unwrap()), ("LONGRANK_MODEL_PATH", one.to_str().unwrap())];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let browser = Browser::start("explains");
    browser.goto(&server.url("/"));
    browser.wait_for("#pipeline option[value=cobert]");
    let menu = browser.script(
        "const p = document.getElementById('pipeline'); return [p.options.length, \
         document.getElementById('depth-label').hidden, document.getElementById('model-label').hidden]",
    );
    assert_eq!(menu, json!([7, true, true]), "bm25: every pipeline listed, no depth, no model menu");
    browser.script(
        "const p = document.getElementById('pipeline'); p.value = 'maxp'; p.dispatchEvent(new Event('change'));",
    );
    let menu = browser.script(
        "return [document.getElementById('depth-label').hidden, document.getElementById('model-label').hidden, \
         [...document.getElementById('model').options].map(o => o.value), \
         document.querySelector('#pipeline option[value=cobert]').disabled]",
    );
    assert_eq!(menu, json!([false, false, ["default", "other"], true]), "maxp: depth and both models; cobert disabled");

    // The model menu's choice reaches the request, and the status names the model and its source.
    browser.script("document.getElementById('model').value = 'other'");
    browser.type_into(&browser.find_all("#q")[0], "oil industry history\u{E007}");
    browser.wait_for("#results li[data-docid]");
    let api = post_json(
        &server.url("/search"),
        r#"{"query": "oil industry history", "pipeline": "maxp", "model": "other", "k": 10, "depth": 20, "segment_text": true}"#,
    )
    .json();
    let n = api["results"].as_array().unwrap().len();
    assert!(n > 1);
    let status = browser.text(&browser.find_all("#status")[0]);
    let other_dir = other.to_str().unwrap();
    assert_eq!(
        status,
        format!("{n} results from gov2, maxp, re-ranked by the model other ({other_dir}) from BM25's top 20.")
    );
    assert!(browser.script("return location.search").as_str().unwrap().contains("model=other"));

    // A document of more than 40 segments: a strip of groups, and the group of the best segment zoomed.
    let first = &api["results"][0];
    let segments = first["segments"].as_array().unwrap();
    assert!(segments.len() > 40, "the test needs a long document: {} segments", segments.len());
    let size = segments.len().div_ceil(40);
    let groups = browser.find_all("#results li:first-child .strip.overview .group");
    assert_eq!(groups.len(), segments.len().div_ceil(size));
    let best = first["best_segment"]["index"].as_u64().unwrap() as usize;
    let zoom = || {
        browser.script("return [...document.querySelectorAll('#results li:first-child .strip.zoom .seg')].map(b => Number(b.dataset.index))")
    };
    let home: Vec<usize> = (best / size * size..((best / size + 1) * size).min(segments.len())).collect();
    assert_eq!(zoom(), json!(home), "the best segment's group is zoomed");
    let passage = || {
        browser
            .script("return document.querySelector('#results li:first-child .passage span:last-child').textContent")
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(passage(), first["best_segment"]["text"].as_str().unwrap());
    // Another group, then one of its segments.
    let other_group = if best / size == 0 { 1 } else { 0 };
    browser.click(&groups[other_group]);
    let zoomed: Vec<usize> = (other_group * size..((other_group + 1) * size).min(segments.len())).collect();
    assert_eq!(zoom(), json!(zoomed));
    let buttons = browser.find_all("#results li:first-child .strip.zoom .seg");
    browser.click(&buttons[1]);
    assert_eq!(passage(), segments[zoomed[1]]["text"].as_str().unwrap());

    // bm25+rm3: the expanded query is shown as the API returns it; one result reads "1 result".
    browser.goto(&server.url("/?q=oil+industry+history&pipeline=bm25%2Brm3&k=1"));
    browser.wait_for("#expansion:not([hidden])");
    let api = post_json(&server.url("/search"), r#"{"query": "oil industry history", "pipeline": "bm25+rm3", "k": 1}"#)
        .json();
    let terms = api["expansion"].as_array().unwrap();
    assert!(!terms.is_empty(), "{api}");
    let first_term = format!("{} {:.3}", terms[0]["term"].as_str().unwrap(), terms[0]["weight"].as_f64().unwrap());
    let shown = browser.text(&browser.find_all("#expansion")[0]);
    assert!(shown.starts_with(&format!("RM3 searched with: {first_term}")), "{shown} vs {first_term}");
    let status = browser.text(&browser.find_all("#status")[0]);
    assert!(status.starts_with("1 result from gov2, bm25+rm3."), "{status}");
}

#[test]
fn a_batch_run_shows_progress_then_metrics_and_compares() {
    let dir = crate::fixtures::cranfield_data_dir();
    let server = TestServer::start(dir.path(), &[]).wait_ready();
    let browser = Browser::start("batch");
    // Without a model, a URL that asks for maxp keeps the whole menu, maxp marked unavailable, and the search
    // answers with the server's reason.
    browser.goto(&server.url("/?q=wing+flutter&pipeline=maxp"));
    browser.wait_for("#status.error");
    let menu = browser.script(
        "const p = document.getElementById('pipeline'); return [p.options.length, p.value, \
         p.querySelector('option[value=maxp]').disabled, p.querySelector('option[value=maxp]').textContent, \
         document.getElementById('status').textContent]",
    );
    assert_eq!(
        (&menu[0], &menu[1], &menu[2], &menu[3]),
        (&json!(7), &json!("maxp"), &json!(true), &json!("maxp (unavailable)"))
    );
    assert!(menu[4].as_str().unwrap().contains("none is configured"), "the server's reason: {menu}");
    browser.goto(&server.url("/?view=batch"));
    // The topic field is a choice; depth is asked only of pipelines that re-rank.
    browser.wait_for("#batch-pipeline option[value=bm25]");
    assert_eq!(browser.script("return [document.getElementById('batch-depth-label').hidden, [...document.getElementById('batch-field').options].map(o => o.value)]"), json!([true, ["title", "desc", "title+desc"]]));
    // Chromium takes only canonical paths for uploads.
    let topics = std::fs::canonicalize(data("cranfield/topics.tsv")).unwrap();
    let qrels = std::fs::canonicalize(data("cranfield/qrels.txt")).unwrap();
    let mut runs: Vec<String> = Vec::new();
    for pipeline in ["bm25", "bm25+rm3"] {
        browser.wait_for(&format!("#batch-pipeline option[value='{pipeline}']"));
        browser.script(&format!("document.getElementById('batch-pipeline').value = '{pipeline}'"));
        browser.script("document.getElementById('batch-field').value = 'title+desc'");
        // The second run is tagged; the first keeps the default tag.
        if pipeline == "bm25+rm3" {
            browser.type_into(&browser.find_all("#batch-tag")[0], "rm3-title-desc");
        }
        browser.type_into(&browser.find_all("#topics-file")[0], topics.to_str().unwrap());
        browser.type_into(&browser.find_all("#qrels-file")[0], qrels.to_str().unwrap());
        browser.click(&browser.find_all("#batch-form button[type=submit]")[0]);
        // The new run's page follows the job until its metrics table appears (read in one script: the page
        // re-renders while it polls).
        let visible = "#job-results:not([hidden]) #job-metrics tr[data-measure=map]";
        let state = format!(
            "const id = new URLSearchParams(location.search).get('job'); const row = document.querySelector('{visible} td'); \
             return [id, document.getElementById('job-title').textContent, row && row.textContent, \
             document.querySelectorAll('#job-chart rect').length]"
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        let shown = loop {
            let shown = browser.script(&state);
            let id = shown[0].as_str().unwrap_or_default().to_string();
            let fresh = !id.is_empty() && !runs.contains(&id) && shown[1].as_str().unwrap().contains(&id);
            if fresh && shown[2].is_string() {
                break shown;
            }
            assert!(Instant::now() < deadline, "the {pipeline} run never showed its metrics: {shown}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let map: f64 = shown[2].as_str().unwrap().parse().unwrap();
        assert!((0.1..0.6).contains(&map), "MAP {map}");
        assert_eq!(shown[3], 225, "one bar per cranfield topic");
        runs.push(shown[0].as_str().unwrap().to_string());
        // Reloading keeps the run: jobs come from the server.
        browser.goto(&server.url(&format!("/?view=batch&job={}", runs.last().unwrap())));
        browser.wait_for(visible);
        // Clear the file inputs for the next run.
        browser.script("document.getElementById('batch-form').reset()");
    }
    browser.goto(&server.url(&format!("/?view=batch&a={}&b={}&measure=map", runs[0], runs[1])));
    browser.wait_for("#compare-result:not([hidden]) #compare-table tbody tr");
    let shown = browser.script(
        "return [document.querySelectorAll('#compare-table tbody tr').length, \
         document.querySelectorAll('#compare-chart rect').length, document.querySelectorAll('#jobs tbody tr').length]",
    );
    assert!(shown[0].as_u64().unwrap() > 5, "{shown}");
    assert_eq!(shown[1], 225, "one delta per topic");
    assert_eq!(shown[2], 2, "both runs listed");
    // p-values as the CLI prints them: never "0.0000".
    let ps = browser.script("return [...document.querySelectorAll('#compare-table-all tbody tr td:nth-child(5)')].map(td => td.textContent)");
    assert!(ps.as_array().unwrap().iter().all(|p| p != "0.0000"), "{ps}");
    assert_eq!(browser.script("return [fmtP(0.00002), fmtP(0.01234)]"), json!(["<0.0001", "0.0123"]));
    // The runs table names each run by its tag, with its collection and date; the compare menus start on two
    // different runs, and each run used the topic field chosen and the tag given.
    browser.goto(&server.url("/?view=batch"));
    browser.wait_for("#jobs tbody tr");
    let table = browser.script(
        "return [[...document.querySelectorAll('#jobs tbody tr td:nth-child(3)')].map(td => td.textContent), \
         [...document.querySelectorAll('#jobs tbody tr td:nth-child(4) time')].length, \
         document.getElementById('compare-a').value, document.getElementById('compare-b').value, \
         [...document.querySelectorAll('#jobs tbody tr td:nth-child(1)')].map(td => td.textContent).sort()]",
    );
    assert_eq!(table[0], json!(["cranfield", "cranfield"]), "{table}");
    assert_eq!(table[1], 2, "{table}");
    assert!(table[2] != table[3] && runs.contains(&table[2].as_str().unwrap().to_string()), "{table}");
    assert_eq!(table[4], json!(["longrank-bm25", "rm3-title-desc"]), "{table}");
    for (run, tag) in runs.iter().zip(["longrank-bm25", "rm3-title-desc"]) {
        let job = crate::common::request("GET", &server.url(&format!("/batch/{run}")), &[], None).json();
        assert_eq!(job["params"]["field"], "title+desc", "{job}");
        let file = crate::common::request("GET", &server.url(&format!("/batch/{run}/run")), &[], None).body;
        assert!(file.lines().next().unwrap().ends_with(&format!(" {tag}")), "{run}: {}", &file[..80]);
    }
}

/// A server with keys: the page asks for one, then searches, follows a job (its warnings shown) and downloads its
/// run with it.
#[test]
fn the_page_works_with_keys_downloads_included() {
    let dir = crate::fixtures::cranfield_data_dir();
    let key = "page-key-5d1e";
    let server = TestServer::start(dir.path(), &[("LONGRANK_SERVER_ADMIN_KEYS", key)]).wait_ready();
    let job = crate::common::request(
        "POST",
        &server.url("/batch?wait=true"),
        &[("content-type", "application/json"), ("authorization", &format!("Bearer {key}"))],
        Some(r#"{"topics": "1\twing flutter\n2\theat transfer\n3\tzzzzqqq\n", "k": 5}"#),
    );
    assert_eq!(job.status, 200, "{}", job.body);
    let id = job.json()["id"].as_str().unwrap().to_string();
    let run = crate::common::request(
        "GET",
        &server.url(&format!("/batch/{id}/run")),
        &[("authorization", &format!("Bearer {key}"))],
        None,
    )
    .body;

    let browser = Browser::start("keys");
    browser.goto(&server.url(&format!("/?view=batch&job={id}")));
    let field = browser.wait_for("#key-form:not([hidden]) #key")[0].clone();
    assert!(browser.displayed(&browser.find_all("#key-form")[0]) && browser.displayed(&field));
    // The server answered: the status asks for the key rather than saying the server is out of reach.
    let status = browser.script("return document.getElementById('status').textContent");
    assert!(status.as_str().unwrap().starts_with("This server needs a key: enter it above"), "{status}");
    browser.type_into(&field, &format!("{key}\u{E007}"));
    browser.wait_for("#job:not([hidden]) #job-download:not([hidden])");
    // The job's warnings are shown as the server words them.
    assert_eq!(browser.find_all("#job-warnings li").len(), 1);
    let warning = browser.text(&browser.find_all("#job-warnings li")[0]);
    assert!(warning.starts_with("1 topic retrieved nothing") && warning.ends_with(": 3"), "{warning}");
    // The run arrives through the page's own download (fetched with the key), caught as it is saved.
    browser.script(
        "URL.createObjectURL = (blob) => { blob.text().then((t) => { window.__run = t; }); return 'blob:caught'; }; \
         URL.revokeObjectURL = () => {};",
    );
    browser.click(&browser.find_all("#job-download")[0]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let downloaded = loop {
        if let Some(text) = browser.script("return window.__run || null").as_str() {
            break text.to_string();
        }
        assert!(Instant::now() < deadline, "the run was never downloaded");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(downloaded, run);
    browser.goto(&server.url("/?q=wing+flutter"));
    let hits = browser.wait_for("#results li[data-docid]");
    assert_eq!(hits.len(), 10, "the session's key serves searches too");
}

/// The collections view: a collection created, a file uploaded into it with the progress bar fed by its task,
/// problems shown with their lines, and a deletion asked to be confirmed first.
#[test]
fn collections_are_created_fed_and_deleted_from_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), &[("LONGRANK_SERVER_DEMO_WHEN_EMPTY", "false")]).wait_ready();
    let browser = Browser::start("collections");
    browser.goto(&server.url("/?view=collections"));
    // CI once typed before the view was shown ("element not interactable").
    browser.type_into(&browser.wait_displayed("#new-name"), "web");
    browser.click(&browser.find_all("#create-form button[type=submit]")[0]);
    browser.wait_for("#collections-table tr[data-collection=web]");

    let docs: String = (0..300)
        .map(|i| format!("{}\n", json!({"id": format!("w{i}"), "text": format!("page {i} about harbor lanterns")})))
        .chain(std::iter::once("not a document\n".to_string()))
        .collect();
    let file = dir.path().join("pages.jsonl");
    std::fs::write(&file, docs).unwrap();
    let file = std::fs::canonicalize(file).unwrap();
    browser.wait_for("#upload-collection option[value=web]");
    browser.type_into(&browser.find_all("#upload-file")[0], file.to_str().unwrap());
    browser.click(&browser.find_all("#upload-form button[type=submit]")[0]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while browser.script("return document.getElementById('collections-status').textContent") == json!("Created web.")
        || browser.find_all("#collections-status.done").is_empty()
    {
        assert!(Instant::now() < deadline, "the upload never finished");
        std::thread::sleep(Duration::from_millis(100));
    }
    let shown = browser.script(
        "return [document.getElementById('collections-status').textContent, \
         document.getElementById('upload-progress').value, \
         [...document.querySelectorAll('#upload-errors li')].map(li => li.textContent), \
         document.querySelector('#collections-table tr[data-collection=web] td.documents').textContent]",
    );
    assert_eq!(shown[0], "Indexed 300 documents into web, skipped 1.", "{shown}");
    assert_eq!(shown[1].as_f64(), Some(1.0), "{shown}");
    assert!(shown[2][0].as_str().unwrap().contains("upload line 301"), "{shown}");
    assert_eq!(shown[3], "300", "{shown}");

    // A deletion not confirmed does nothing; confirmed, the collection goes.
    browser.script("window.confirm = () => false");
    browser.click(&browser.find_all("#collections-table tr[data-collection=web] button.delete")[0]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(browser.find_all("#collections-table tr[data-collection=web]").len(), 1);
    browser.script("window.confirm = () => true");
    browser.click(&browser.find_all("#collections-table tr[data-collection=web] button.delete")[0]);
    // A status that says done describes the table as it is then (CI once read the table in between).
    let deadline = Instant::now() + Duration::from_secs(30);
    while browser.find_all("#collections-status.done").is_empty()
        || browser.text(&browser.find_all("#collections-status")[0]) != "Deleted web."
    {
        assert!(Instant::now() < deadline, "the deletion never finished");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(browser.find_all("#collections-table tr[data-collection=web]").is_empty(), "the collection stayed listed");
}

/// The page's first stage: a hybrid search from its URL ranks as `/search` does, each hit naming its fused score
/// and its rank in each list; then dense from the form.
#[test]
fn the_page_searches_through_the_dense_and_hybrid_first_stages() {
    let dir = tempfile::tempdir().unwrap();
    cli_ok(dir.path(), &["index", "--collection", "adi", data("adi/docs.jsonl").to_str().unwrap()]);
    let minilm = crate::common::minilm();
    let env = [("LONGRANK_MODEL_PATH", minilm.to_str().unwrap())];
    let out = crate::common::cli_env(dir.path(), &["embed", "--collection", "adi"], &env);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let browser = Browser::start("first-stage");
    let query = "retrieval of articles from their titles";
    browser.goto(&server.url(&format!("/?q={}&collection=adi&first_stage=hybrid", query.replace(' ', "+"))));
    browser.wait_for("#results li[data-docid]");
    let api = |first_stage: &str| {
        let body = json!({"query": query, "collection": "adi", "first_stage": first_stage, "k": 10});
        post_json(&server.url("/search"), &body.to_string()).json()
    };
    let expected = api("hybrid");
    let hits = expected["results"].as_array().unwrap();
    let docids = || browser.script("return [...document.querySelectorAll('#results li')].map(li => li.dataset.docid)");
    let want = |hits: &[Value]| Value::Array(hits.iter().map(|h| h["docid"].clone()).collect());
    assert_eq!(docids(), want(hits));
    assert_eq!(browser.script("return document.getElementById('first_stage').value"), json!("hybrid"));
    let notes = browser.script("return [...document.querySelectorAll('#results li .meta')].map(m => m.textContent)");
    for (note, hit) in notes.as_array().unwrap().iter().zip(hits) {
        let lists = &hit["first_stages"];
        let ranks: Vec<String> = [("bm25", "BM25"), ("dense", "dense")]
            .iter()
            .filter(|(l, _)| lists.get(l).is_some())
            .map(|(l, name)| format!("{name} #{}", lists[l]["rank"]))
            .collect();
        let want = format!("fused {:.4} ({})", hit["first_stage_score"].as_f64().unwrap(), ranks.join(", "));
        assert!(note.as_str().unwrap().contains(&want), "{note} lacks {want}");
    }
    // Dense from the form.
    browser.script("document.getElementById('first_stage').value = 'dense'; document.querySelector('#search button[type=submit]').click();");
    let dense = api("dense");
    let dense_hits = dense["results"].as_array().unwrap();
    crate::common::wait_until("the dense results", Duration::from_secs(20), || docids() == want(dense_hits));
    let first = browser.script("return document.querySelector('#results li .meta').textContent");
    let want = format!("dense {:.3}", dense_hits[0]["first_stage_score"].as_f64().unwrap());
    assert!(first.as_str().unwrap().contains(&want), "{first} lacks {want}");
}

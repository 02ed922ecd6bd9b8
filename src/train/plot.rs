//! The training curves as an SVG next to the checkpoint: the loss per step (and its moving average) and
//! every dev measure at each evaluation.

use std::fmt::Write;
use std::path::Path;

use super::TrainError;

const WIDTH: f64 = 640.0;
const PANEL: f64 = 220.0;
const MARGIN: f64 = 48.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// Reads `log` and writes `svg`.
pub fn write_curves(log: &Path, svg: &Path, title: &str) -> Result<(), TrainError> {
    let text = std::fs::read_to_string(log).map_err(|e| TrainError::io(log, e))?;
    let mut loss = Vec::new();
    let mut dev: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
    for entry in text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) {
        let Some(step) = entry.get("step").and_then(|s| s.as_f64()) else { continue };
        if let Some(value) = entry.get("loss").and_then(|l| l.as_f64()) {
            loss.push((step, value));
        }
        for (name, value) in entry.get("dev").and_then(|d| d.as_object()).into_iter().flatten() {
            if let Some(value) = value.as_f64() {
                dev.entry(name.clone()).or_default().push((step, value));
            }
        }
    }
    let window = (loss.len() / 20).max(1);
    let average: Vec<(f64, f64)> = (0..loss.len())
        .map(|i| {
            let from = i.saturating_sub(window - 1);
            (loss[i].0, loss[from..=i].iter().map(|p| p.1).sum::<f64>() / (i + 1 - from) as f64)
        })
        .collect();
    let mut out = String::new();
    let height = 2.0 * PANEL + 3.0 * MARGIN;
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{MARGIN}" y="16" font-size="13">{}</text>"#,
        escape(title)
    );
    panel(
        &mut out,
        MARGIN,
        "training loss (per step, moving average)",
        &[("loss", &loss, "#bbbbbb"), ("average", &average, COLORS[0])],
    );
    let series: Vec<Series> =
        dev.iter().zip(COLORS.iter().cycle().skip(1)).map(|((n, s), c)| (n.as_str(), s.as_slice(), *c)).collect();
    panel(&mut out, 2.0 * MARGIN + PANEL, "dev", &series);
    out.push_str("</svg>\n");
    std::fs::write(svg, out).map_err(|e| TrainError::io(svg, e))
}

/// A line of a panel: its name, its (x, y) points and its colour.
type Series<'a> = (&'a str, &'a [(f64, f64)], &'a str);

fn panel(out: &mut String, top: f64, title: &str, series: &[Series]) {
    let points = series.iter().flat_map(|s| s.1.iter());
    let (x0, x1, y0, y1) = points.fold((f64::MAX, f64::MIN, f64::MAX, f64::MIN), |(a, b, c, d), p| {
        (a.min(p.0), b.max(p.0), c.min(p.1), d.max(p.1))
    });
    let _ = writeln!(out, r#"<text x="{MARGIN}" y="{}">{}</text>"#, top - 6.0, escape(title));
    let right = WIDTH - MARGIN;
    let _ = writeln!(
        out,
        r##"<rect x="{MARGIN}" y="{top}" width="{}" height="{PANEL}" fill="none" stroke="#888"/>"##,
        right - MARGIN
    );
    if x0 > x1 {
        return;
    }
    let (x1, y1) = (if x1 > x0 { x1 } else { x0 + 1.0 }, if y1 > y0 { y1 } else { y0 + 1e-9 });
    let sx = |x: f64| MARGIN + (x - x0) / (x1 - x0) * (right - MARGIN);
    let sy = |y: f64| top + PANEL - (y - y0) / (y1 - y0) * PANEL;
    let _ =
        writeln!(out, r#"<text x="4" y="{}">{y1:.3}</text><text x="4" y="{}">{y0:.3}</text>"#, top + 10.0, top + PANEL);
    let _ = writeln!(
        out,
        r#"<text x="{MARGIN}" y="{}">step {x0}</text><text x="{}" y="{}" text-anchor="end">{x1}</text>"#,
        top + PANEL + 14.0,
        right,
        top + PANEL + 14.0
    );
    for (i, (name, points, color)) in series.iter().enumerate() {
        let path: Vec<String> = points.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect();
        let _ =
            writeln!(out, r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#, path.join(" "));
        if points.len() < 30 {
            for (x, y) in points.iter() {
                let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#, sx(*x), sy(*y));
            }
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" fill="{color}" text-anchor="end">{}</text>"#,
            right - 4.0,
            top + 14.0 + 13.0 * i as f64,
            escape(name)
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    #[test]
    fn curves_draw_the_logged_series() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.jsonl");
        std::fs::write(
            &log,
            "{\"step\":1,\"loss\":1.0}\n{\"step\":2,\"loss\":0.5}\n{\"step\":2,\"dev\":{\"mrr@10\":0.7}}\n",
        )
        .unwrap();
        super::write_curves(&log, &dir.path().join("c.svg"), "allp <run>").unwrap();
        let svg = std::fs::read_to_string(dir.path().join("c.svg")).unwrap();
        assert_eq!(svg.matches("<polyline").count(), 3, "{svg}");
        assert!(svg.contains("mrr@10") && svg.contains("allp &lt;run&gt;"));
    }
}

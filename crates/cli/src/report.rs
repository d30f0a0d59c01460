//! `ugds report`: one SVG from the JSON that `ugds bench --json` writes
//! (several runs or several machines overlaid): bandwidth by request size,
//! and the latency distribution (CDF) of each size.

use serde_json::Value;
use std::fmt::Write;

pub const HELP: &str = "\
Usage: ugds report [-o FILE] [--title TEXT] [--bars] BENCH.json...

Draws `ugds bench --json` files into one SVG (FILE, default report.svg):
bandwidth (MiB/s) by request size, one line per file and mode, and the
latency CDF of each run. Each file is labelled by its name without .json.

--bars   IOPS per workload (request size and queue depth) instead, one bar
         per file in each workload, on a log scale: for workloads that
         differ in depth as well as size (scripts/qemu-bench).
";

const PALETTE: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// A run's latency distribution: (us, fraction of I/Os at or below).
type Cdf = Vec<(f64, f64)>;

/// One line of the bandwidth panel: a file's runs of one mode and engine.
struct Series {
    label: String,
    /// (request size, MiB/s, latency CDF).
    points: Vec<(f64, f64, Cdf)>,
}

fn series(name: &str, doc: &Value) -> Result<Vec<Series>, String> {
    let runs = doc["runs"].as_array().ok_or_else(|| format!("{name}: no \"runs\" (not `ugds bench --json` output)"))?;
    let mut out: Vec<Series> = Vec::new();
    for r in runs {
        let key = format!(
            "{} {} {} qd {}",
            name,
            r["mode"].as_str().unwrap_or("?"),
            r["engine"].as_str().unwrap_or("?"),
            r["qd"]
        );
        let (Some(size), Some(mibs)) = (r["size"].as_f64(), r["mib_s"].as_f64()) else {
            return Err(format!("{name}: a run without size or mib_s"));
        };
        let cdf = r["latency_us"]["cdf"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| Some((p[0].as_f64()?, p[1].as_f64()?))).collect())
            .unwrap_or_default();
        match out.iter_mut().find(|s| s.label == key) {
            Some(s) => s.points.push((size, mibs, cdf)),
            None => out.push(Series { label: key, points: vec![(size, mibs, cdf)] }),
        }
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(out)
}

/// A panel's frame: where it is, and how values map into it.
struct Panel {
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
}

impl Panel {
    fn at(&self, fx: f64, fy: f64) -> (f64, f64) {
        (self.x0 + fx.clamp(0.0, 1.0) * self.w, self.y0 + self.h - fy.clamp(0.0, 1.0) * self.h)
    }

    fn frame(&self, svg: &mut String, title: &str, xlabel: &str, ylabel: &str) {
        let _ = writeln!(
            svg,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
            self.x0, self.y0, self.w, self.h
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>"#,
            self.x0 + self.w / 2.0,
            self.y0 - 8.0,
            esc(title)
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>"#,
            self.x0 + self.w / 2.0,
            self.y0 + self.h + 34.0,
            esc(xlabel)
        );
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{y}" font-size="12" text-anchor="middle" transform="rotate(-90 {x} {y})">{}</text>"#,
            esc(ylabel),
            x = self.x0 - 46.0,
            y = self.y0 + self.h / 2.0
        );
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The SVG of `files` (name, parsed JSON).
pub fn draw(title: &str, files: &[(String, Value)]) -> Result<String, String> {
    let mut all = Vec::new();
    for (name, doc) in files {
        all.extend(series(name, doc)?);
    }
    if all.is_empty() {
        return Err("no runs to draw".into());
    }
    let lats: Vec<f64> =
        all.iter().flat_map(|s| s.points.iter().flat_map(|p| p.2.iter().map(|c| c.0))).filter(|&u| u > 0.0).collect();
    // Without latency distributions (medians from another tool) the CDF
    // panel is left out.
    let (w, h) = (if lats.is_empty() { 520.0 } else { 1000.0 }, 520.0);
    let mut svg = String::new();
    let _ =
        writeln!(svg, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">"#);
    let _ = writeln!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#, w / 2.0, esc(title));
    // Bandwidth by size: log2 x, linear y from 0.
    let bw = Panel { x0: 70.0, y0: 60.0, w: 380.0, h: 280.0 };
    bw.frame(&mut svg, "bandwidth by request size", "request size", "MiB/s");
    let sizes: Vec<f64> = {
        let mut v: Vec<f64> = all.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    };
    let (lo, hi) = (sizes[0].log2(), sizes[sizes.len() - 1].log2());
    let fx = |size: f64| if hi > lo { (size.log2() - lo) / (hi - lo) } else { 0.5 };
    let ymax = all.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0, f64::max) * 1.1;
    for &s in &sizes {
        let (x, y) = bw.at(fx(s), 0.0);
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
            y + 16.0,
            crate::fmt_bytes(s as u64)
        );
    }
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let (x, y) = bw.at(0.0, i as f64 / 4.0);
        let _ =
            writeln!(svg, r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{v:.0}</text>"#, x - 4.0, y + 4.0);
    }
    for (i, s) in all.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|p| {
                let (x, y) = bw.at(fx(p.0), if ymax > 0.0 { p.1 / ymax } else { 0.0 });
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ =
            writeln!(svg, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        for p in &pts {
            let (x, y) = p.split_once(',').expect("x,y");
            let _ = writeln!(svg, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
        }
    }
    // Latency CDFs: log10 x over every run's range, fraction y.
    let cdf = Panel { x0: 560.0, y0: 60.0, w: 400.0, h: 280.0 };
    let (llo, lhi) = lats.iter().fold((1.0f64, 10.0f64), |(a, b), &u| (a.min(u), b.max(u)));
    let (llo, lhi) =
        (llo.max(0.01).log10().floor(), lhi.max(0.01).log10().ceil().max(llo.max(0.01).log10().floor() + 1.0));
    let lx = |us: f64| (us.max(0.01).log10() - llo) / (lhi - llo);
    if !lats.is_empty() {
        cdf.frame(&mut svg, "latency distribution (CDF)", "latency, us (log scale)", "fraction of I/Os");
    }
    for d in (llo as i32..=lhi as i32).filter(|_| !lats.is_empty()) {
        let (x, y) = cdf.at(lx(10f64.powi(d)), 0.0);
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
            y + 16.0,
            10f64.powi(d)
        );
    }
    for i in (0..=4).filter(|_| !lats.is_empty()) {
        let (x, y) = cdf.at(0.0, i as f64 / 4.0);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{:.2}</text>"#,
            x - 4.0,
            y + 4.0,
            i as f64 / 4.0
        );
    }
    let mut legend = Vec::new();
    let mut n = 0;
    for (i, s) in all.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        legend.push((color, s.label.clone(), ""));
        for (j, p) in s.points.iter().enumerate() {
            if p.2.is_empty() {
                continue;
            }
            // Sizes of one series: the same colour, a dash pattern each.
            let dash = ["", "6,3", "2,2", "8,3,2,3"][j % 4];
            let pts: Vec<String> =
                p.2.iter()
                    .map(|&(us, q)| {
                        let (x, y) = cdf.at(lx(us), q);
                        format!("{x:.1},{y:.1}")
                    })
                    .collect();
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" stroke-dasharray="{dash}" points="{}"><title>{} {}</title></polyline>"#,
                pts.join(" "),
                esc(&s.label),
                crate::fmt_bytes(p.0 as u64)
            );
            n += 1;
        }
    }
    // Legend: one line per series; dash patterns name the sizes in order.
    let mut y = 390.0;
    for (color, label, _) in &legend {
        let _ = writeln!(svg, r#"<line x1="70" y1="{y}" x2="100" y2="{y}" stroke="{color}" stroke-width="3"/>"#);
        let _ = writeln!(svg, r#"<text x="108" y="{}" font-size="12">{}</text>"#, y + 4.0, esc(label));
        y += 18.0;
    }
    let sizes_text: Vec<String> = sizes.iter().map(|&s| crate::fmt_bytes(s as u64)).collect();
    if lats.is_empty() {
        svg.push_str("</svg>\n");
        return Ok(svg);
    }
    let _ = writeln!(
        svg,
        r#"<text x="560" y="394" font-size="11">CDF: a series' colour; solid, dashed, dotted, dash-dot: its sizes</text>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="560" y="410" font-size="11">in order ({}); {n} curves</text>"#,
        esc(&sizes_text.join(", "))
    );
    svg.push_str("</svg>\n");
    Ok(svg)
}

/// IOPS of each file's runs per workload, as grouped bars on a log scale.
pub fn draw_bars(title: &str, files: &[(String, Value)]) -> Result<String, String> {
    // A workload (size, qd) and each file's IOPS in it.
    type Group = ((u64, u64), Vec<Option<f64>>);
    let mut groups: Vec<Group> = Vec::new();
    for (i, (name, doc)) in files.iter().enumerate() {
        let runs =
            doc["runs"].as_array().ok_or_else(|| format!("{name}: no \"runs\" (not `ugds bench --json` output)"))?;
        for r in runs {
            let (Some(size), Some(qd)) = (r["size"].as_u64(), r["qd"].as_u64()) else {
                return Err(format!("{name}: a run without size or qd"));
            };
            let iops = r["iops"].as_f64().or_else(|| Some(r["mib_s"].as_f64()? * (1 << 20) as f64 / size as f64));
            let Some(iops) = iops.filter(|v| *v > 0.0) else {
                return Err(format!("{name}: a run without iops or mib_s"));
            };
            let at = match groups.iter().position(|g| g.0 == (size, qd)) {
                Some(at) => at,
                None => {
                    groups.push(((size, qd), vec![None; files.len()]));
                    groups.len() - 1
                }
            };
            groups[at].1[i] = Some(iops);
        }
    }
    if groups.is_empty() {
        return Err("no runs to draw".into());
    }
    groups.sort_by_key(|g| g.0);
    let all = groups.iter().flat_map(|g| g.1.iter().flatten());
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(a, b), &v| (a.min(v), b.max(v)));
    let (dlo, dhi) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let bar = 14.0;
    let group_w = bar * files.len() as f64 + 24.0;
    let panel = Panel { x0: 80.0, y0: 60.0, w: group_w * groups.len() as f64, h: 280.0 };
    let (w, h) = (panel.w + 120.0, 400.0 + 18.0 * files.len() as f64);
    let mut svg = String::new();
    let _ =
        writeln!(svg, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">"#);
    let _ = writeln!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#, w / 2.0, esc(title));
    panel.frame(&mut svg, "IOPS by workload", "request size, queue depth", "IOPS (log scale)");
    let fy = |v: f64| (v.log10() - dlo) / (dhi - dlo);
    for d in dlo as i32..=dhi as i32 {
        let (x, y) = panel.at(0.0, fy(10f64.powi(d)));
        let _ = writeln!(svg, r#"<text x="{}" y="{}" font-size="11" text-anchor="end">1e{d}</text>"#, x - 4.0, y + 4.0);
    }
    for (g, ((size, qd), vals)) in groups.iter().enumerate() {
        let gx = panel.x0 + g as f64 * group_w + 12.0;
        let (_, base) = panel.at(0.0, 0.0);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{} QD{qd}</text>"#,
            gx + bar * files.len() as f64 / 2.0,
            base + 16.0,
            crate::fmt_bytes(*size)
        );
        for (i, v) in vals.iter().enumerate() {
            let Some(v) = v else { continue };
            let (_, top) = panel.at(0.0, fy(*v));
            let _ = writeln!(
                svg,
                r#"<rect x="{:.1}" y="{top:.1}" width="{}" height="{:.1}" fill="{}"><title>{} {} QD{qd}: {v:.0} IOPS</title></rect>"#,
                gx + bar * i as f64,
                bar - 2.0,
                base - top,
                PALETTE[i % PALETTE.len()],
                esc(&files[i].0),
                crate::fmt_bytes(*size)
            );
        }
    }
    let mut y = 390.0;
    for (i, (name, _)) in files.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let _ = writeln!(svg, r#"<rect x="80" y="{}" width="24" height="10" fill="{color}"/>"#, y - 5.0);
        let _ = writeln!(svg, r#"<text x="112" y="{}" font-size="12">{}</text>"#, y + 4.0, esc(name));
        y += 18.0;
    }
    svg.push_str("</svg>\n");
    Ok(svg)
}

pub fn main(args: Vec<std::ffi::OsString>) -> Result<(), String> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut out, mut title, mut inputs, mut bars) =
        (std::path::PathBuf::from("report.svg"), "ugds bench".to_string(), Vec::new(), false);
    while let Some(a) = p.next().map_err(|e| e.to_string())? {
        match a {
            Short('o') | Long("output") => out = p.value().map_err(|e| e.to_string())?.into(),
            Long("title") => {
                title = p.value().map_err(|e| e.to_string())?.string().map_err(|_| "--title: not UTF-8")?
            }
            Long("bars") => bars = true,
            Value(v) => inputs.push(std::path::PathBuf::from(v)),
            Short('h') | Long("help") => {
                print!("{HELP}");
                return Ok(());
            }
            _ => return Err(a.unexpected().to_string()),
        }
    }
    if inputs.is_empty() {
        return Err(format!("no input files\n{HELP}"));
    }
    let mut files = Vec::new();
    for path in &inputs {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.file_stem().map_or("?".into(), |s| s.to_string_lossy().into_owned());
        files.push((name, doc));
    }
    let svg = if bars { draw_bars(&title, &files)? } else { draw(&title, &files)? };
    std::fs::write(&out, svg).map_err(|e| format!("{}: {e}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(size: u64, qd: u64, iops: f64) -> Value {
        json!({"mode": "randread", "engine": "io_queue", "size": size, "qd": qd, "iops": iops})
    }

    #[test]
    fn bars_group_by_workload_and_leave_gaps_for_missing_runs() {
        let a = json!({"runs": [run(4096, 1, 40000.0), run(4096, 32, 350000.0), run(131072, 8, 70000.0)]});
        // mib_s alone is enough (IOPS derived from it); one workload missing.
        let b = json!({"runs": [{"size": 4096, "qd": 1, "mib_s": 27.0}, run(131072, 8, 22000.0)]});
        let svg = draw_bars("t", &[("ugds".into(), a), ("pread".into(), b)]).unwrap();
        assert_eq!(svg.matches("<title>").count(), 5, "a bar per run present");
        for w in ["4 KiB QD1", "4 KiB QD32", "128 KiB QD8"] {
            assert!(svg.contains(&format!(">{w}</text>")), "group label {w}");
        }
        assert!(svg.contains("<title>pread 4 KiB QD1: 6912 IOPS</title>"), "27 MiB/s of 4 KiB reads");
        assert!(svg.contains(">1e3</text>") && svg.contains(">1e6</text>"), "decades from 1e3 to 1e6");
        assert!(svg.contains(">ugds</text>") && svg.contains(">pread</text>"), "legend");
    }

    #[test]
    fn bars_refuse_files_that_are_not_bench_output() {
        assert!(draw_bars("t", &[("x".into(), json!({}))]).unwrap_err().contains("no \"runs\""));
        assert!(draw_bars("t", &[("x".into(), json!({"runs": [{"size": 4096}]}))]).unwrap_err().contains("qd"));
        assert!(draw_bars("t", &[("x".into(), json!({"runs": []}))]).unwrap_err().contains("no runs"));
    }
}

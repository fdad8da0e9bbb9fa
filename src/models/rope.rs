//! Rotary position embeddings (rotate-half layout) with the `rope_scaling` variants that HF
//! configs name: `linear`, `llama3`, `yarn`, `longrope` (`su`). Anything else is refused with the
//! config key named, so a model never runs with positions it was not trained for.
//!
//! MLX's `fast::rope` takes per-dimension periods (angle = position / period), so every variant
//! is reduced to a table of periods plus a factor that multiplies q and k (yarn's and longrope's
//! attention scaling, which HF applies to cos and sin).

use crate::engine::config::ConfigFile;
use crate::engine::error::Result;
use crate::kernels::rope::RopeAngles;
use mlx_rs::Array;
use serde_json::Value;

/// How `rope_theta` is settled when the file leaves it out (`Fallback::Computed`).
pub const THETA_DEFAULT: &str = "rope_parameters.rope_theta (where transformers 5 saves it), else 10000.0";

/// The RoPE base: `rope_theta`, else `rope_parameters.rope_theta`, else 10000 (every family's
/// class default).
pub fn theta(cfg: &ConfigFile) -> Result<f32> {
    let nested = cfg.opt("rope_parameters").and_then(|p| p.get("rope_theta")).filter(|v| !v.is_null());
    Ok(match (cfg.opt("rope_theta"), nested) {
        (Some(_), _) => cfg.f64("rope_theta")? as f32,
        (None, Some(theta)) => theta.as_f64().ok_or_else(|| cfg.invalid("rope_parameters.rope_theta", "expected a number"))? as f32,
        (None, None) => 10000.0,
    })
}

#[derive(Clone)]
pub struct Rope {
    /// The angles for every position (longrope: up to `original_max_position_embeddings`).
    angles: RopeAngles,
    /// longrope: the original context length, the angles of a sequence that passes it, and the
    /// attention factor the length ratio implies (MiniCPM's code uses it even when the config
    /// names another).
    long: Option<(usize, RopeAngles, f32)>,
}

impl Rope {
    pub fn plain(dims: usize, base: f32) -> Self {
        Self { angles: RopeAngles { dims: dims as i32, base, periods: None, position_scale: 1.0, mscale: 1.0 }, long: None }
    }

    /// Reads `rope_theta` (default 10000) and `rope_scaling` from the config, or both from
    /// `rope_parameters`, where transformers 5 saves them.
    pub fn from_config(cfg: &ConfigFile, dims: usize) -> Result<Self> {
        let parameters = cfg.opt("rope_parameters");
        let base = theta(cfg)?;
        let mut rope = Self::plain(dims, base);
        let (section, scaling) = match (cfg.opt("rope_scaling"), parameters) {
            (Some(scaling), _) => ("rope_scaling", scaling),
            (None, Some(parameters)) => ("rope_parameters", parameters),
            (None, None) => return Ok(rope),
        };
        let key = |k: &str| format!("{section}.{k}");
        let num = |k: &str| -> Result<f64> {
            scaling.get(k).and_then(Value::as_f64).ok_or_else(|| cfg.invalid(&key(k), "expected a number"))
        };
        let num_or = |k: &str, default: f64| -> Result<f64> {
            match scaling.get(k) {
                None | Some(Value::Null) => Ok(default),
                Some(_) => num(k),
            }
        };
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(Value::as_str)
            .ok_or_else(|| cfg.invalid(section, "expected a `rope_type` (or `type`) string"))?;
        let half = dims / 2;
        let default_periods: Vec<f32> = (0..half).map(|i| base.powf(2.0 * i as f32 / dims as f32)).collect();
        match kind {
            "default" => {}
            // Per-dimension period multipliers (llama.cpp's `rope_freqs` tensor, from GGUF import).
            "freq_factors" => {
                let factors: Vec<f32> = scaling
                    .get("factors")
                    .and_then(Value::as_array)
                    .and_then(|l| l.iter().map(|v| v.as_f64().map(|f| f as f32)).collect::<Option<Vec<_>>>())
                    .filter(|l| l.len() == half)
                    .ok_or_else(|| cfg.invalid(&key("factors"), format!("expected {half} numbers")))?;
                rope.angles.periods = Some(table(factors.iter().zip(&default_periods).map(|(f, p)| f * p).collect()));
            }
            "linear" => rope.angles.position_scale = 1.0 / num("factor")? as f32,
            "llama3" => {
                let factor = num("factor")?;
                let low = num("low_freq_factor")?;
                let high = num("high_freq_factor")?;
                let original = num("original_max_position_embeddings")?;
                let (low_wavelen, high_wavelen) = (original / low, original / high);
                let periods = default_periods
                    .iter()
                    .map(|&p| {
                        let p = p as f64;
                        let wavelen = 2.0 * std::f64::consts::PI * p;
                        if wavelen < high_wavelen {
                            p
                        } else if wavelen > low_wavelen {
                            p * factor
                        } else {
                            let smooth = (original / wavelen - low) / (high - low);
                            p / ((1.0 - smooth) / factor + smooth)
                        }
                    })
                    .map(|p| p as f32)
                    .collect();
                rope.angles.periods = Some(table(periods));
            }
            "yarn" => {
                let factor = num("factor")?;
                let original = num("original_max_position_embeddings")?;
                let beta_fast = num_or("beta_fast", 32.0)?;
                let beta_slow = num_or("beta_slow", 1.0)?;
                let d = dims as f64;
                let correction = |rotations: f64| {
                    d * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * (base as f64).ln())
                };
                let low = correction(beta_fast).floor().max(0.0);
                let mut high = correction(beta_slow).ceil().min(d - 1.0);
                if high == low {
                    high += 0.001;
                }
                let periods = default_periods
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| {
                        // Dimensions below `low` rotate fast enough to keep (extrapolate), those above
                        // `high` are interpolated (period × factor), a linear ramp between.
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let keep = 1.0 - ramp;
                        let inv = (1.0 - keep) / (factor * p as f64) + keep / p as f64;
                        (1.0 / inv) as f32
                    })
                    .collect();
                rope.angles.periods = Some(table(periods));
                let get_mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
                // HF: an explicit attention_factor wins; else the mscale ratio when both are set
                // (and non-zero); else 0.1·ln(factor) + 1.
                let set = |k: &str| scaling.get(k).and_then(Value::as_f64).filter(|v| *v != 0.0);
                rope.angles.mscale = match (scaling.get("attention_factor").filter(|v| !v.is_null()), set("mscale"), set("mscale_all_dim")) {
                    (Some(_), _, _) => num("attention_factor")? as f32,
                    (None, Some(m), Some(all)) => (get_mscale(m) / get_mscale(all)) as f32,
                    _ => get_mscale(1.0) as f32,
                };
            }
            "longrope" | "su" => {
                let factors = |k: &str| -> Result<Vec<f32>> {
                    let list = scaling
                        .get(k)
                        .and_then(Value::as_array)
                        .and_then(|l| l.iter().map(|v| v.as_f64().map(|f| f as f32)).collect::<Option<Vec<_>>>())
                        .ok_or_else(|| cfg.invalid(&key(k), "expected a list of numbers"))?;
                    if list.len() != half {
                        return Err(cfg.invalid(&key(k), format!("has {} entries, expected {half} (head_dim/2)", list.len())));
                    }
                    Ok(list.iter().zip(&default_periods).map(|(f, p)| f * p).collect())
                };
                let original = match scaling.get("original_max_position_embeddings") {
                    Some(_) => num("original_max_position_embeddings")?,
                    None => cfg.f64("original_max_position_embeddings")?,
                };
                let max = cfg.f64("max_position_embeddings")?;
                rope.angles.periods = Some(table(factors("short_factor")?));
                let factor = max / original;
                let default_factor =
                    if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / original.ln()).sqrt() };
                rope.angles.mscale = num_or("attention_factor", default_factor)? as f32;
                let long = RopeAngles { periods: Some(table(factors("long_factor")?)), ..rope.angles.clone() };
                rope.long = Some((original as usize, long, default_factor as f32));
            }
            other => {
                return Err(cfg.invalid(
                    section,
                    format!("type `{other}` is not supported (supported: linear, llama3, yarn, longrope)"),
                ))
            }
        }
        Ok(rope)
    }

    /// MiniCPM's own longrope picks its factors once — the long ones when the model's context is
    /// longer than the original one, for every position — and always uses the attention factor
    /// the length ratio implies.
    pub fn fix_longrope_choice(&mut self, max_position: usize) {
        if let Some((original, long, mscale)) = self.long.take() {
            if max_position > original {
                self.angles.periods = long.periods;
            }
            self.angles.mscale = mscale;
        }
    }

    /// The angles of a forward pass whose positions end before `end` (longrope switches to its
    /// long factors for a sequence that passes the original context).
    pub fn angles(&self, end: usize) -> &RopeAngles {
        match &self.long {
            Some((original, long, _)) if end > *original => long,
            _ => &self.angles,
        }
    }

    /// Rotates `x` `[B, H, T, D]` whose first row is at position `offset`.
    pub fn apply(&self, x: &Array, offset: usize) -> Result<Array> {
        Ok(self.angles(offset + x.shape()[2] as usize).apply(x, &[offset])?)
    }
}

/// A period table as the MLX array `fast::rope` takes, built once rather than per call.
fn table(periods: Vec<f32>) -> Array {
    Array::from_slice(&periods, &[periods.len() as i32])
}

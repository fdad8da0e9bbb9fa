//! Model states kept across requests, by the token ids they hold: a prompt that starts with a
//! kept sequence's tokens starts from that sequence's state and prefills only the rest.
//!
//! A kept sequence ([`Entry`]) is its attention layers' buffers after all its tokens plus a list
//! of restart [`Point`]s. Attention keys, values and pooled key windows depend only on the tokens
//! before them, so cutting them back to any shorter length is exact. A recurrent (linear-
//! attention) state cannot be cut back, so a point keeps the recurrent states as they were after
//! its length: a hybrid model restarts only at points, a model of attention layers alone at any
//! length. A sequence being prefilled collects its points in a [`Trail`]: every
//! [`SNAPSHOT_SPACING`] tokens (at most [`MAX_TRAIL_POINTS`] of them, the spacing doubling past
//! that), where the prompt stops sharing tokens with a kept sequence (the next prompt over the
//! same document restarts exactly there), before the prompt's last token, at its end and at the
//! end of the answer. Holding a state costs no copy (MLX arrays are immutable; the sequence that
//! goes on writes new buffers). States are kept within a byte budget, least recently used
//! dropped first; the bytes are those of the buffers held, each counted once.

use super::cache::{Checkpoint, ModelCache};
use mlx_rs::error::Result;
use std::collections::HashSet;
use std::rc::Rc;

/// Tokens between the restart points a long prompt leaves behind (a follow-up that shares all
/// but the end of a long prompt re-runs at most this many of its tokens).
pub const SNAPSHOT_SPACING: usize = 4096;
/// Spaced points one sequence keeps; past it, every other one is dropped and the spacing doubles
/// (a 1M-token document keeps 64 points 16K tokens apart instead of 256).
pub const MAX_TRAIL_POINTS: usize = 64;

/// A length a kept sequence can restart from, with its recurrent states at that length.
pub struct Point {
    pub checkpoint: Checkpoint,
    /// Kept through thinning (a branch, the prompt's end, an answer's end).
    pinned: bool,
}

impl Point {
    pub fn len(&self) -> usize {
        self.checkpoint.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The restart points of one sequence, collected while it runs.
#[derive(Clone)]
pub struct Trail {
    points: Vec<Rc<Point>>,
    /// Lengths at which a point must be taken exactly (prefill chunks end there).
    stops: Vec<usize>,
    spacing: usize,
    /// The length past which the next spaced point is taken.
    next_mark: usize,
    /// Whether the model has recurrent layers (otherwise any length is a restart point).
    recurrent: bool,
}

impl Trail {
    /// A trail for a sequence starting from `cache`.
    pub fn new(cache: &ModelCache) -> Self {
        let len = cache.len();
        Self {
            points: Vec::new(),
            stops: Vec::new(),
            spacing: SNAPSHOT_SPACING,
            next_mark: (len / SNAPSHOT_SPACING + 1) * SNAPSHOT_SPACING,
            recurrent: cache.has_recurrent(),
        }
    }

    /// Takes a point exactly at `len` tokens when the sequence passes it.
    pub fn stop_at(&mut self, len: usize) {
        if self.recurrent && len > 0 && !self.stops.contains(&len) {
            self.stops.push(len);
        }
    }

    /// Where a prefill chunk from `len` of at most `step` tokens should end: before the next stop.
    pub fn chunk_end(&self, len: usize, step: usize) -> usize {
        let end = len + step.max(1);
        self.stops.iter().copied().filter(|&s| s > len).fold(end, usize::min)
    }

    /// After a chunk: keeps a point if the cache reached a stop or passed the next mark.
    pub fn observe(&mut self, cache: &ModelCache) -> Result<()> {
        let len = cache.len();
        if !self.recurrent || self.points.last().is_some_and(|p| p.len() == len) {
            return Ok(());
        }
        let stop = self.stops.contains(&len);
        if stop || len >= self.next_mark {
            self.points.push(Rc::new(Point { checkpoint: cache.detached_checkpoint()?, pinned: stop }));
            while self.next_mark <= len {
                self.next_mark += self.spacing;
            }
            self.thin();
        }
        Ok(())
    }

    /// Keeps a pinned point at the cache's current length (the end of a prompt or an answer).
    pub fn mark_end(&mut self, cache: &ModelCache) -> Result<()> {
        if self.recurrent && self.points.last().is_none_or(|p| p.len() != cache.len()) {
            self.points.push(Rc::new(Point { checkpoint: cache.detached_checkpoint()?, pinned: true }));
        }
        Ok(())
    }

    /// Past [`MAX_TRAIL_POINTS`] spaced points, drops every other one and doubles the spacing.
    fn thin(&mut self) {
        if self.points.iter().filter(|p| !p.pinned).count() > MAX_TRAIL_POINTS {
            self.halve_spaced();
        }
    }

    /// Drops every other spaced point (the first of each pair, so a lone one too) and doubles
    /// the spacing of those to come; `false` when there was none to drop.
    fn halve_spaced(&mut self) -> bool {
        let before = self.points.len();
        let mut spaced = 0;
        self.points.retain(|p| {
            if p.pinned {
                return true;
            }
            spaced += 1;
            spaced % 2 == 0
        });
        let dropped = self.points.len() < before;
        if dropped {
            self.spacing *= 2;
        }
        dropped
    }

    /// Goes on from `cache` (its spaced points counted from there).
    pub fn restart_from(&mut self, cache: &ModelCache) {
        self.next_mark = (cache.len() / self.spacing + 1) * self.spacing;
    }

    pub fn points(&self) -> &[Rc<Point>] {
        &self.points
    }

    /// A trail holding `points` (read back from a file) for a sequence of `cache`.
    pub fn from_points(cache: &ModelCache, points: Vec<Checkpoint>) -> Self {
        let mut trail = Self::new(cache);
        trail.points = points.into_iter().map(|checkpoint| Rc::new(Point { checkpoint, pinned: true })).collect();
        trail
    }
}

/// A kept sequence.
struct Entry {
    tokens: Vec<u32>,
    /// The state after all `tokens`; recurrent layers emptied when the trail holds them.
    cache: ModelCache,
    /// Where it can restart (for a model with recurrent layers; the last one is at its end).
    trail: Trail,
    used: u64,
}

impl Entry {
    /// The longest length up to `limit` it can restart from, and the point to restart from
    /// (`None` for a model of attention layers alone, which restarts anywhere).
    fn restart_at(&self, limit: usize) -> Option<(usize, Option<&Rc<Point>>)> {
        let limit = limit.min(self.tokens.len());
        if !self.trail.recurrent {
            return (limit > 0).then_some((limit, None));
        }
        let point = self.trail.points.iter().rev().find(|p| p.len() <= limit && !p.is_empty())?;
        Some((point.len(), Some(point)))
    }

    /// The state after its first `len` tokens (a restart length from [`Entry::restart_at`]).
    fn state_at(&self, len: usize, point: Option<&Rc<Point>>) -> crate::engine::error::Result<ModelCache> {
        let mut cache = self.cache.clone();
        match point {
            Some(point) => cache.restore(point.checkpoint.clone()),
            None => cache.truncate_attention(len)?,
        }
        Ok(cache)
    }
}

pub struct PrefixCache {
    entries: Vec<Entry>,
    budget: u64,
    /// Counts lookups and inserts, to order entries by last use.
    clock: u64,
}

/// Where a prompt starts: the state to start from and the trail to go on with.
pub struct Start {
    /// Prompt tokens the state already holds.
    pub tokens: usize,
    pub cache: ModelCache,
    pub trail: Trail,
}

/// How many tokens `a` and `b` share at their start.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// Keeps at most `budget` bytes of states (0 keeps none).
    pub fn new(budget: u64) -> Self {
        Self { entries: Vec::new(), budget, clock: 0 }
    }

    /// Where `prompt` starts: from the kept state that holds the most of it, leaving at least
    /// one token to run (the next token's distribution comes from running one), else from
    /// `fresh`. The trail takes points where the prompt stops sharing tokens with a kept
    /// sequence and before its last token, so the next prompt like it restarts there.
    pub fn start(&mut self, prompt: &[u32], fresh: ModelCache) -> crate::engine::error::Result<Start> {
        self.clock += 1;
        let limit = prompt.len().saturating_sub(1);
        let shared: Vec<usize> = self.entries.iter().map(|e| common_prefix(&e.tokens, prompt).min(limit)).collect();
        let best = self
            .entries
            .iter()
            .zip(&shared)
            .enumerate()
            .filter_map(|(i, (e, &n))| e.restart_at(n).map(|(len, _)| (i, len)))
            .max_by_key(|&(_, len)| len);
        let (tokens, cache, mut trail) = match best {
            Some((i, len)) => {
                let entry = &mut self.entries[i];
                entry.used = self.clock;
                let (_, point) = entry.restart_at(len).expect("found above");
                let cache = entry.state_at(len, point)?;
                let mut trail = Trail::new(&cache);
                trail.points = entry.trail.points.iter().filter(|p| p.len() <= len).cloned().collect();
                (len, cache, trail)
            }
            None => {
                let trail = Trail::new(&fresh);
                (0, fresh, trail)
            }
        };
        if let Some(&branch) = shared.iter().max() {
            if branch > tokens {
                trail.stop_at(branch);
            }
        }
        trail.stop_at(limit);
        Ok(Start { tokens, cache, trail })
    }

    /// Keeps `cache`, which holds exactly `tokens`, with its trail (a point is added at its end);
    /// kept sequences it covers (a prefix of it with every point in its trail: the prompt an
    /// answer follows) are dropped, then the least recently used until the budget holds. A
    /// windowed cache (tokens evicted) is not kept: it no longer holds its tokens.
    pub fn insert(&mut self, tokens: &[u32], cache: &ModelCache, trail: &mut Trail) -> Result<()> {
        if self.budget == 0 || tokens.is_empty() || cache.is_windowed() || cache.len() != tokens.len() {
            return Ok(());
        }
        trail.mark_end(cache)?;
        self.clock += 1;
        let mut kept = cache.clone();
        if trail.recurrent {
            kept.clear_recurrent();
        }
        let entry = Entry { tokens: tokens.to_vec(), cache: kept, trail: trail.clone(), used: self.clock };
        self.entries.retain(|e| !covers(&entry, e));
        self.entries.push(entry);
        self.fit();
        Ok(())
    }

    /// Drops the least recently used entries until the budget holds; an entry too big on its own
    /// gives up spaced points first.
    fn fit(&mut self) {
        while self.held_bytes() > self.budget {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else { break };
            if self.entries.len() == 1 && self.entries[0].trail.halve_spaced() {
                continue;
            }
            self.entries.swap_remove(oldest);
        }
    }

    /// Bytes of the buffers the kept states hold, each counted once (sequences that share
    /// restart points hold them once).
    pub fn held_bytes(&self) -> u64 {
        let mut seen = HashSet::new();
        let mut total = 0u64;
        for e in &self.entries {
            total += e.cache.attention_nbytes() as u64;
            for p in &e.trail.points {
                if seen.insert(Rc::as_ptr(p)) {
                    total += p.checkpoint.nbytes() as u64;
                }
            }
        }
        total
    }

    /// Sequences kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Whether `a` can restart everywhere `b` can: `b`'s tokens start `a`'s, and (with recurrent
/// layers) each of `b`'s points is one of `a`'s.
fn covers(a: &Entry, b: &Entry) -> bool {
    a.tokens.starts_with(&b.tokens)
        && (!b.trail.recurrent || b.trail.points.iter().all(|p| a.trail.points.iter().any(|q| Rc::ptr_eq(p, q))))
}

//! Model states kept across requests, by the token ids they hold: a prompt that starts with a
//! kept sequence's tokens starts from that sequence's state and prefills only the rest.
//!
//! A kept sequence ([`Entry`]) is its attention layers' buffers after all its tokens plus a list
//! of restart [`Point`]s. Attention keys, values and pooled key windows depend only on the tokens
//! before them, so cutting them back to any shorter length is exact. A recurrent (linear-
//! attention) state cannot be cut back, so a point keeps the recurrent states as they were after
//! its length: a hybrid model restarts only at points, a model of attention layers alone at any
//! length. A sequence being prefilled collects its points in a [`Trail`]: every
//! [`SNAPSHOT_SPACING`] tokens (at most [`MAX_TRAIL_POINTS`] of them; past that older ones are
//! thinned, the newest kept), where the prompt stops sharing tokens with a kept sequence (the
//! next prompt over the same document restarts exactly there), before the prompt's last token,
//! at its end and at the end of the answer. Holding a state costs no copy (MLX arrays are immutable; the sequence that
//! goes on writes new buffers). States are kept within a byte budget, least recently used
//! dropped first; the bytes are those of the buffers held, each counted once.

use super::cache::{Checkpoint, ModelCache};
use mlx_rs::error::Result;
use std::collections::HashSet;
use std::rc::Rc;

/// Tokens between the restart points a long prompt leaves behind (a follow-up that shares all
/// but the end of a long prompt re-runs at most this many of its tokens).
pub const SNAPSHOT_SPACING: usize = 2048;
/// Spaced points one sequence keeps (a hybrid model's recurrent states can be 48 MiB a point); past it, older
/// ones are thinned.
pub const MAX_TRAIL_POINTS: usize = 32;
/// The newest spaced points thinning spares: a follow-up usually leaves a long prompt near its
/// end (another question after the same document), so the last 32K tokens keep a point every
/// 2048 while older points spread evenly over the rest.
pub const DENSE_TAIL_POINTS: usize = 16;

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
                self.next_mark += SNAPSHOT_SPACING;
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

    /// Past [`MAX_TRAIL_POINTS`] spaced points, drops older ones (not the newest
    /// [`DENSE_TAIL_POINTS`]), each time the one whose neighbours are closest, so the rest stay
    /// evenly spread.
    fn thin(&mut self) {
        loop {
            let spaced: Vec<usize> = (0..self.points.len()).filter(|&i| !self.points[i].pinned).collect();
            if spaced.len() <= MAX_TRAIL_POINTS {
                return;
            }
            let len = |k: usize| self.points[spaced[k]].len();
            let merged_gap = |k: usize| len(k + 1) - if k == 0 { 0 } else { len(k - 1) };
            let Some(k) = (0..spaced.len() - DENSE_TAIL_POINTS).min_by_key(|&k| merged_gap(k)) else { return };
            self.points.remove(spaced[k]);
        }
    }

    /// Drops every other spaced point (the first of each pair, so a lone one too); `false` when
    /// there was none to drop.
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
        self.points.len() < before
    }

    /// Goes on from `cache` (its spaced points counted from there).
    pub fn restart_from(&mut self, cache: &ModelCache) {
        self.next_mark = (cache.len() / SNAPSHOT_SPACING + 1) * SNAPSHOT_SPACING;
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

    /// Puts `points` (read back from a file, shorter than every point held) before its own.
    pub fn prepend(&mut self, points: Vec<Checkpoint>) {
        let first = self.points.first().map_or(usize::MAX, |p| p.len());
        let earlier = points.into_iter().filter(|c| c.len() < first).map(|checkpoint| Rc::new(Point { checkpoint, pinned: true }));
        self.points.splice(0..0, earlier);
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

    /// The kept sequences (token ids, state after them with recurrent layers emptied, restart
    /// points), least recently used first.
    pub fn kept(&self) -> Vec<(&[u32], &ModelCache, &Trail)> {
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by_key(|e| e.used);
        entries.into_iter().map(|e| (&e.tokens[..], &e.cache, &e.trail)).collect()
    }

    /// Bytes it may keep.
    pub fn budget(&self) -> u64 {
        self.budget
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The spaced points a 1M-token prompt leaves: at most MAX_TRAIL_POINTS, one every 2048 tokens
    /// over the last 32K, evenly spread before, the end kept.
    #[test]
    fn a_long_prompt_keeps_its_last_points_dense() {
        let mut trail = Trail { points: Vec::new(), stops: Vec::new(), next_mark: SNAPSHOT_SPACING, recurrent: true };
        let total = 1 << 20;
        for len in (1..=total / SNAPSHOT_SPACING).map(|i| i * SNAPSHOT_SPACING) {
            trail.points.push(Rc::new(Point { checkpoint: Checkpoint::from_states(len, vec![None]), pinned: false }));
            trail.thin();
            assert!(trail.points.len() <= MAX_TRAIL_POINTS);
        }
        let lens: Vec<usize> = trail.points.iter().map(|p| p.len()).collect();
        assert_eq!((lens.len(), *lens.last().unwrap()), (MAX_TRAIL_POINTS, total));
        let tail = &lens[lens.len() - DENSE_TAIL_POINTS..];
        assert!(tail.windows(2).all(|w| w[1] - w[0] == SNAPSHOT_SPACING), "{lens:?}");
        // The older points cover the rest: no gap (from 0) more than twice the even one.
        let even = total / (MAX_TRAIL_POINTS - DENSE_TAIL_POINTS);
        let starts = std::iter::once(0).chain(lens.iter().copied());
        assert!(starts.zip(&lens).all(|(a, &b)| b > a && b - a <= 2 * even), "{lens:?}");
        // Under a memory budget, every other point goes, the newest too.
        assert!(trail.halve_spaced());
        assert_eq!(trail.points.len(), MAX_TRAIL_POINTS / 2);
    }
}

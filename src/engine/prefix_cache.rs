//! Model states kept across requests, by the token ids they hold: a request whose prompt starts
//! with a kept state's tokens starts from a copy of that state and prefills only the rest.
//!
//! A state is a whole [`ModelCache`] (attention keys and values, pooled keys, recurrent states),
//! so restoring one is exact for every layer type: recurrent state, which cannot be cut back to a
//! shorter prefix, is simply never cut. Holding a state is cheap (MLX arrays are immutable: the
//! copy shares them). States are kept within a byte budget, the least recently used dropped first.

use super::cache::ModelCache;

pub struct PrefixCache {
    entries: Vec<Entry>,
    budget: u64,
    /// Counts lookups and inserts, to order entries by last use.
    clock: u64,
}

struct Entry {
    tokens: Vec<u32>,
    cache: ModelCache,
    bytes: u64,
    used: u64,
}

/// A kept state that a prompt can start from.
pub struct Hit {
    /// Prompt tokens the state already holds.
    pub tokens: usize,
    pub cache: ModelCache,
}

impl PrefixCache {
    /// Keeps at most `budget` bytes of states (0 keeps none).
    pub fn new(budget: u64) -> Self {
        Self { entries: Vec::new(), budget, clock: 0 }
    }

    /// The longest kept state whose tokens start `prompt` and leave at least one of its tokens to
    /// run (the next token's distribution comes from running one).
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<Hit> {
        self.clock += 1;
        let clock = self.clock;
        let best = self
            .entries
            .iter_mut()
            .filter(|e| e.tokens.len() < prompt.len() && prompt.starts_with(&e.tokens))
            .max_by_key(|e| e.tokens.len())?;
        best.used = clock;
        Some(Hit { tokens: best.tokens.len(), cache: best.cache.clone() })
    }

    /// Keeps `cache`, which holds exactly `tokens`; then drops the least recently used states
    /// until the budget holds. A windowed cache (tokens evicted) is not kept: it no longer holds
    /// its tokens.
    pub fn insert(&mut self, tokens: &[u32], cache: &ModelCache) {
        if tokens.is_empty() || cache.is_windowed() || cache.len() != tokens.len() {
            return;
        }
        self.clock += 1;
        self.entries.retain(|e| e.tokens != tokens);
        let bytes = cache.nbytes() as u64;
        self.entries.push(Entry { tokens: tokens.to_vec(), cache: cache.clone(), bytes, used: self.clock });
        while self.held_bytes() > self.budget {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else { break };
            self.entries.swap_remove(oldest);
        }
    }

    /// Bytes of the kept states (each counted whole, shared arrays included).
    pub fn held_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// States kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

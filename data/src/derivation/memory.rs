//! What this replica served and accepted in the last window, in memory: per tenant, the items
//! each trace read, and the fingerprints of every text (a run of words -> the items that hold
//! it). Bounded in entries and bytes: memory is kept in generations of a quarter window each,
//! the oldest dropped as the window moves on, or sooner when a bound is reached (what goes
//! early is counted as evicted).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lethe_policy::TraceId;

/// Shards, each with its own lock and generations; keys are spread by their (random) hash.
const SHARDS: usize = 16;
/// Generations kept besides the current one, each a quarter window: an entry lives at least a
/// window and a quarter (so that a text seen again within a generation, and not remembered
/// again, is still remembered a whole window after it was last seen), at most a window and a
/// half.
const OLDER: usize = 5;
/// Generations per window.
const PER_WINDOW: u32 = 4;
/// The most items one run of words is remembered for (a run that many texts share is
/// boilerplate, not a quote of anyone's).
const MOST_PER_KEY: usize = 64;

/// One remembered item: where it is kept and whose it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Remembered {
    pub tenant: String,
    pub store: String,
    pub collection: String,
    pub id: String,
    /// Its stamp's subject.
    pub owner: String,
    /// A model's answer.
    pub answer: bool,
}

impl Remembered {
    /// What holding it costs: itself behind its shared pointer, and its strings.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Remembered>()
            + 2 * std::mem::size_of::<usize>()
            + self.tenant.len()
            + self.store.len()
            + self.collection.len()
            + self.id.len()
            + self.owner.len()
    }
}

/// The bounds of the memory, across all shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub window: Duration,
    pub max_traces: usize,
    pub max_fingerprints: usize,
    pub max_bytes: u64,
}

/// How full the memory is, and what it dropped before its time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub traces: usize,
    pub fingerprints: usize,
    pub bytes: usize,
    pub evicted_traces: u64,
    pub evicted_fingerprints: u64,
}

/// Fingerprints and text keys are random already: they are their own hash.
#[derive(Default)]
struct AsIs(u64);

impl Hasher for AsIs {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type AsIsMap<V> = HashMap<u64, V, BuildHasherDefault<AsIs>>;

/// The bytes a hash table of `capacity` entries of `entry` bytes takes: buckets for 8/7 of them
/// (hashbrown's load factor), each with its control byte.
fn table_bytes(capacity: usize, entry: usize) -> usize {
    capacity.saturating_mul(8) / 7 * (entry + 1)
}

struct Generation {
    started: Instant,
    items: Vec<Arc<Remembered>>,
    traces: HashMap<(String, TraceId), Vec<u32>>,
    /// A run of words -> the first item that holds it; further ones in `shared`.
    quotes: AsIsMap<u32>,
    shared: AsIsMap<Vec<u32>>,
    /// Texts remembered in this generation (an item's text seen again is not fingerprinted
    /// again).
    texts: HashSet<u64, BuildHasherDefault<AsIs>>,
    /// The (trace, item) pairs of `traces`, by their hash.
    read: HashSet<u64, BuildHasherDefault<AsIs>>,
    fingerprints: usize,
    /// What the items' strings and the trace and shared lists hold on the heap.
    heap: usize,
}

impl Generation {
    fn new(started: Instant) -> Generation {
        Generation {
            started,
            items: Vec::new(),
            traces: HashMap::new(),
            quotes: AsIsMap::default(),
            shared: AsIsMap::default(),
            texts: HashSet::default(),
            read: HashSet::default(),
            fingerprints: 0,
            heap: 0,
        }
    }

    /// The memory the generation takes: its tables by their capacity, and what they point to.
    fn bytes(&self) -> usize {
        use std::mem::size_of;
        self.heap
            + self.items.capacity() * size_of::<Arc<Remembered>>()
            + table_bytes(
                self.traces.capacity(),
                size_of::<(String, TraceId)>() + size_of::<Vec<u32>>(),
            )
            + table_bytes(self.quotes.capacity(), size_of::<(u64, u32)>())
            + table_bytes(self.shared.capacity(), size_of::<(u64, Vec<u32>)>())
            + table_bytes(self.texts.capacity(), size_of::<u64>())
            + table_bytes(self.read.capacity(), size_of::<u64>())
    }

    /// The slot of `item` in this generation: the last one again when it is the same item.
    fn slot(&mut self, item: &Arc<Remembered>) -> Option<u32> {
        let last = self.items.last().is_some_and(|l| Arc::ptr_eq(l, item));
        if !last {
            self.heap += item.bytes();
            self.items.push(Arc::clone(item));
        }
        u32::try_from(self.items.len().checked_sub(1)?).ok()
    }

    fn quote(&mut self, run: u64, slot: u32) {
        match self.quotes.get(&run) {
            None => {
                self.quotes.insert(run, slot);
            }
            Some(&first) if first == slot => return,
            Some(_) => {
                let more = self.shared.entry(run).or_default();
                if more.len() + 1 >= MOST_PER_KEY || more.contains(&slot) {
                    return;
                }
                more.push(slot);
                self.heap += std::mem::size_of::<u32>();
            }
        }
        self.fingerprints += 1;
    }

    fn items_at<'g>(
        &'g self,
        slots: impl Iterator<Item = &'g u32>,
    ) -> impl Iterator<Item = &'g Arc<Remembered>> {
        slots.filter_map(|s| self.items.get(*s as usize))
    }
}

struct Shard {
    current: Generation,
    /// The newest first.
    older: VecDeque<Generation>,
}

impl Shard {
    /// Moves the shard on to `now`: a new current generation once the current one is a quarter
    /// window old, and older ones dropped once nothing they hold is within the window.
    fn advance(&mut self, now: Instant, span: Duration) {
        let lifetime = span * (OLDER as u32 + 1);
        while self
            .older
            .back()
            .is_some_and(|g| now.saturating_duration_since(g.started) >= lifetime)
        {
            self.older.pop_back();
        }
        if now.saturating_duration_since(self.current.started) >= span {
            let done = std::mem::replace(&mut self.current, Generation::new(now));
            self.older.push_front(done);
            self.older.truncate(OLDER);
        }
    }

    fn generations(&self) -> impl Iterator<Item = &Generation> {
        std::iter::once(&self.current).chain(&self.older)
    }

    fn sum(&self, of: impl Fn(&Generation) -> usize) -> usize {
        self.generations().map(of).sum()
    }
}

/// The memory of one replica.
pub struct Memory {
    shards: Vec<Mutex<Shard>>,
    /// A quarter window: how long each generation takes new entries.
    span: Duration,
    per_shard: Limits,
    evicted_traces: AtomicU64,
    evicted_fingerprints: AtomicU64,
    /// Keys the (trace, item) pairs a generation knows; random per process.
    read_key: std::hash::RandomState,
}

impl Memory {
    pub fn new(limits: Limits, now: Instant) -> Memory {
        let shards = u64::try_from(SHARDS).unwrap_or(1);
        let per_shard = Limits {
            window: limits.window,
            max_traces: (limits.max_traces / SHARDS).max(1),
            max_fingerprints: (limits.max_fingerprints / SHARDS).max(1),
            max_bytes: (limits.max_bytes / shards).max(1),
        };
        let shard = || {
            Mutex::new(Shard {
                current: Generation::new(now),
                older: VecDeque::new(),
            })
        };
        Memory {
            shards: (0..SHARDS).map(|_| shard()).collect(),
            span: limits.window / PER_WINDOW,
            per_shard,
            evicted_traces: AtomicU64::new(0),
            evicted_fingerprints: AtomicU64::new(0),
            read_key: std::hash::RandomState::new(),
        }
    }

    /// The shard a key (a fingerprint, a text key, a trace) belongs to, moved on to `now`.
    fn shard(&self, key: u64, now: Instant) -> MutexGuard<'_, Shard> {
        self.shard_at(shard_of(key), now)
    }

    fn shard_at(&self, index: usize, now: Instant) -> MutexGuard<'_, Shard> {
        let mut shard = self.shards[index % SHARDS]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        shard.advance(now, self.span);
        shard
    }

    /// Whether the text `key` (an item's text, hashed with its identity) is new to the current
    /// generation; it is remembered as seen. Only a text new to the generation is fingerprinted
    /// and its runs remembered.
    pub fn first_sight(&self, key: u64, now: Instant) -> bool {
        let mut shard = self.shard(key, now);
        let first = shard.current.texts.insert(key);
        if first {
            self.bound(&mut shard);
        }
        first
    }

    /// Remembers that `item` was served under `trace`.
    pub fn traced_item(&self, item: &Arc<Remembered>, trace: TraceId, now: Instant) {
        let mut shard = self.shard(trace_key(&trace), now);
        let generation = &mut shard.current;
        // Every item a trace reads is remembered (however many it reads first, the later ones
        // are linked too); one read again in the generation is known already.
        let known = !generation
            .read
            .insert(self.read_key.hash_one((trace.0, &**item)));
        if !known && let Some(slot) = generation.slot(item) {
            let slots = generation
                .traces
                .entry((item.tenant.clone(), trace))
                .or_default();
            let grown = slots.capacity();
            slots.push(slot);
            let tenant = if grown == 0 { item.tenant.len() } else { 0 };
            let added = (slots.capacity() - grown) * std::mem::size_of::<u32>() + tenant;
            generation.heap += added;
        }
        self.bound(&mut shard);
    }

    /// Remembers that `item`'s text holds these runs of words.
    pub fn quotable(&self, item: &Arc<Remembered>, runs: &[u64], now: Instant) {
        for (index, runs) in by_shard(runs).iter().enumerate() {
            if runs.is_empty() {
                continue;
            }
            let mut shard = self.shard_at(index, now);
            if let Some(slot) = shard.current.slot(item) {
                for &run in runs {
                    shard.current.quote(run, slot);
                }
            }
            self.bound(&mut shard);
        }
    }

    /// Drops the oldest generations while the shard is over a bound, counting what they held.
    fn bound(&self, shard: &mut Shard) {
        let limits = self.per_shard;
        let over = |s: &Shard| {
            s.sum(|g| g.traces.len()) > limits.max_traces
                || s.sum(|g| g.fingerprints) > limits.max_fingerprints
                || s.sum(Generation::bytes) as u64 > limits.max_bytes
        };
        while over(shard) {
            let dropped = match shard.older.pop_back() {
                Some(oldest) => oldest,
                // The current generation alone is over: it goes, and a new one starts.
                None => {
                    let started = shard.current.started;
                    std::mem::replace(&mut shard.current, Generation::new(started))
                }
            };
            self.evicted_traces
                .fetch_add(dropped.traces.len() as u64, Ordering::Relaxed);
            self.evicted_fingerprints
                .fetch_add(dropped.fingerprints as u64, Ordering::Relaxed);
        }
    }

    /// Items of `tenant` served under `trace` within the window.
    pub fn traced(&self, tenant: &str, trace: TraceId, now: Instant) -> Vec<Arc<Remembered>> {
        let shard = self.shard(trace_key(&trace), now);
        let key = (tenant.to_owned(), trace);
        let mut found: Vec<Arc<Remembered>> = Vec::new();
        for generation in shard.generations() {
            if let Some(slots) = generation.traces.get(&key) {
                for item in generation.items_at(slots.iter()) {
                    if !found.iter().any(|f| **f == **item) {
                        found.push(Arc::clone(item));
                    }
                }
            }
        }
        found
    }

    /// An erased subject's key is forgotten (`key` -> its reference `name`, once its erasure
    /// completed): its items are remembered under the reference, their ids renamed as the state
    /// store renames them, so what quotes them or read them is still refused until they age
    /// out.
    pub fn forget(&self, tenant: &str, key: &str, name: &str) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let Shard { current, older } = &mut *shard;
            for generation in std::iter::once(current).chain(older.iter_mut()) {
                for item in &mut generation.items {
                    if item.tenant != tenant || item.owner != key {
                        continue;
                    }
                    let forgotten = Remembered {
                        owner: name.to_owned(),
                        id: item.id.replace(key, name),
                        ..(**item).clone()
                    };
                    generation.heap =
                        (generation.heap + forgotten.bytes()).saturating_sub(item.bytes());
                    *item = Arc::new(forgotten);
                }
            }
        }
    }

    /// Items of `tenant` whose texts hold one of `runs`, within the window.
    pub fn quoted(&self, tenant: &str, runs: &[u64], now: Instant) -> Vec<Arc<Remembered>> {
        let mut found: Vec<Arc<Remembered>> = Vec::new();
        for (index, runs) in by_shard(runs).iter().enumerate() {
            if runs.is_empty() {
                continue;
            }
            let shard = self.shard_at(index, now);
            for generation in shard.generations() {
                for run in runs {
                    let first = generation.quotes.get(run).into_iter();
                    let more = generation.shared.get(run).into_iter().flatten();
                    for item in generation.items_at(first.chain(more)) {
                        // Fingerprints are keyed per tenant; the tenant is checked all the same.
                        if item.tenant == tenant && !found.iter().any(|f| **f == **item) {
                            found.push(Arc::clone(item));
                        }
                    }
                }
            }
        }
        found
    }

    /// Its metrics, in the Prometheus text format.
    pub fn render(&self) -> String {
        let s = self.stats();
        format!(
            "# HELP lethe_lineage_memory_entries What the data plane remembers of the lineage window: traces read, fingerprints of texts.\n\
             # TYPE lethe_lineage_memory_entries gauge\n\
             lethe_lineage_memory_entries{{memory=\"traces\"}} {}\n\
             lethe_lineage_memory_entries{{memory=\"fingerprints\"}} {}\n\
             # HELP lethe_lineage_memory_bytes The memory both take.\n\
             # TYPE lethe_lineage_memory_bytes gauge\n\
             lethe_lineage_memory_bytes {}\n\
             # HELP lethe_lineage_evictions_total Entries dropped before the window passed, to stay within [lineage] bounds.\n\
             # TYPE lethe_lineage_evictions_total counter\n\
             lethe_lineage_evictions_total{{memory=\"traces\"}} {}\n\
             lethe_lineage_evictions_total{{memory=\"fingerprints\"}} {}\n",
            s.traces, s.fingerprints, s.bytes, s.evicted_traces, s.evicted_fingerprints
        )
    }

    pub fn stats(&self) -> Stats {
        let mut stats = Stats {
            evicted_traces: self.evicted_traces.load(Ordering::Relaxed),
            evicted_fingerprints: self.evicted_fingerprints.load(Ordering::Relaxed),
            ..Stats::default()
        };
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            stats.traces += shard.sum(|g| g.traces.len());
            stats.fingerprints += shard.sum(|g| g.fingerprints);
            stats.bytes += shard.sum(Generation::bytes);
        }
        stats
    }
}

/// Runs of words, grouped by the shard they live in (each shard is locked once).
fn by_shard(runs: &[u64]) -> Vec<Vec<u64>> {
    let mut grouped = vec![Vec::new(); SHARDS];
    for &run in runs {
        if let Some(group) = grouped.get_mut(shard_of(run)) {
            group.push(run);
        }
    }
    grouped
}

/// A key's shard, from bits its hash tables do not use: hashbrown places an entry by the low
/// bits of its hash (here the key itself) and tags it with the top seven, so a shard of keys
/// alike in either would crowd into a few of its buckets.
fn shard_of(key: u64) -> usize {
    usize::try_from((key >> 32) % SHARDS as u64).unwrap_or(0)
}

fn trace_key(trace: &TraceId) -> u64 {
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace.0[8..]);
    u64::from_le_bytes(low)
}

#[cfg(test)]
mod tests;

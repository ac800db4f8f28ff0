//! A hash table from a 64-bit key to an arena slot, built for indexes that
//! outgrow the CPU cache. Each entry is 8 bytes, the slot and 32 bits of the
//! key's hash (its tag), so a probe reads one cache line, not a control byte
//! line and then a bucket line. Within a shard an entry's home is the tag's
//! top bits, and each run of entries is kept sorted by tag (ordered linear
//! probing): a lookup stops at the first larger tag, and growing a shard is
//! one sequential pass that never reads the keys.
//!
//! The low bits of the tag pick one of `SHARDS` tables. Uniform keys fill
//! them at one rate, so each grows at its own load (`grow_load`), from 7/8
//! down to 7/8 of 1/√2: the doublings of a growing table spread over the
//! growth from 0.62 to 0.88 of a power of two instead of landing on one
//! insert, and each moves a thirty-second of the table.

const EMPTY: u32 = u32::MAX;
/// Entries past the last home, so that no run wraps around.
const TAIL: usize = 64;
const SHARD_BITS: u32 = 5;
const SHARDS: usize = 1 << SHARD_BITS;
/// The fewest homes an allocated shard has.
const MIN_BITS: u32 = 4;

#[derive(Copy, Clone)]
struct Entry {
    tag: u32,
    slot: u32,
}

const FREE: Entry = Entry {
    tag: 0,
    slot: EMPTY,
};

struct Shard {
    entries: Vec<Entry>,
    /// log2 of the number of homes; 0, with one free entry, while nothing
    /// is allocated.
    bits: u32,
    /// 32 - bits: a home is the tag shifted right by it.
    shift: u32,
    len: usize,
    /// The load, in 1/2^16, past which this shard doubles.
    grow_load: u64,
}

pub struct SlotTable {
    shards: Vec<Shard>,
    len: usize,
}

/// The tag of a key hash: its top 32 bits.
fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

fn shard_of(tag: u32) -> usize {
    (tag as usize) & (SHARDS - 1)
}

/// Shard `i`'s growth load: 7/8 · 2^(-i / 2·SHARDS), in 1/2^16.
fn grow_load(i: usize) -> u64 {
    let load = 0.875 * (-(i as f64) / (2 * SHARDS) as f64).exp2();
    (load * 65_536.0) as u64
}

impl Default for SlotTable {
    fn default() -> Self {
        SlotTable {
            shards: (0..SHARDS)
                .map(|i| Shard {
                    entries: vec![FREE],
                    shift: 32,
                    bits: 0,
                    len: 0,
                    grow_load: grow_load(i),
                })
                .collect(),
            len: 0,
        }
    }
}

impl Shard {
    fn home(&self, tag: u32) -> usize {
        (u64::from(tag) >> self.shift) as usize
    }

    /// Whether `len` entries fit 2^bits homes at this shard's growth load.
    fn fits(&self, len: usize, bits: u32) -> bool {
        (len as u64) << 16 <= self.grow_load << bits
    }

    /// The entries from `tag`'s home on; none while nothing is allocated.
    fn from_home(&self, tag: u32) -> &[Entry] {
        &self.entries[self.home(tag)..]
    }

    fn insert(&mut self, tag: u32, slot: u32) {
        if self.bits == 0 || !self.fits(self.len + 1, self.bits) {
            self.resize(self.bits.max(MIN_BITS - 1) + 1);
        }
        loop {
            let start = self.home(tag);
            let place = start
                + self.entries[start..]
                    .iter()
                    .position(|e| e.slot == EMPTY || e.tag > tag)
                    .expect("the last entry is always free");
            let free = place
                + self.entries[place..]
                    .iter()
                    .position(|e| e.slot == EMPTY)
                    .expect("the last entry is always free");
            if free + 1 == self.entries.len() {
                self.resize(self.bits + 1);
                continue;
            }
            self.entries.copy_within(place..free, place + 1);
            self.entries[place] = Entry { tag, slot };
            self.len += 1;
            return;
        }
    }

    fn remove(&mut self, tag: u32, slot: u32) -> bool {
        let start = self.home(tag);
        let Some(at) = self.entries[start..]
            .iter()
            .take_while(|e| e.slot != EMPTY && e.tag <= tag)
            .position(|e| e.tag == tag && e.slot == slot)
        else {
            return false;
        };
        let mut hole = start + at;
        // Backward shift: pull displaced followers one step toward home.
        loop {
            let next = self.entries[hole + 1];
            if next.slot == EMPTY || self.home(next.tag) > hole {
                break;
            }
            self.entries[hole] = next;
            hole += 1;
        }
        self.entries[hole] = FREE;
        self.len -= 1;
        true
    }

    fn live(&self) -> impl Iterator<Item = Entry> + '_ {
        self.entries.iter().copied().filter(|e| e.slot != EMPTY)
    }

    fn remap(&mut self, remap: impl Fn(u32) -> Option<u32>) {
        let kept: Vec<Entry> = self
            .live()
            .filter_map(|e| remap(e.slot).map(|slot| Entry { tag: e.tag, slot }))
            .collect();
        let mut bits = MIN_BITS;
        while !self.fits(kept.len(), bits) {
            bits += 1;
        }
        if kept.is_empty() {
            bits = 0;
        }
        self.rebuild(bits, kept.into_iter());
    }

    fn resize(&mut self, bits: u32) {
        let old = std::mem::take(&mut self.entries);
        self.rebuild(bits, old.into_iter().filter(|e| e.slot != EMPTY));
    }

    /// Lays `entries`, in tag order, into a shard of 2^bits homes: each goes
    /// to its home or just after the one before, in one pass.
    fn rebuild(&mut self, bits: u32, entries: impl Iterator<Item = Entry> + Clone) {
        let mut bits = bits;
        'sized: loop {
            self.bits = bits;
            self.shift = 32 - bits;
            self.entries = if bits == 0 {
                vec![FREE]
            } else {
                vec![FREE; (1usize << bits) + TAIL]
            };
            self.len = 0;
            let mut next = 0usize;
            for entry in entries.clone() {
                let at = next.max(self.home(entry.tag));
                if at + 1 >= self.entries.len() {
                    bits += 1;
                    continue 'sized;
                }
                self.entries[at] = entry;
                self.len += 1;
                next = at + 1;
            }
            return;
        }
    }
}

impl SlotTable {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    fn shard(&self, tag: u32) -> &Shard {
        &self.shards[shard_of(tag)]
    }

    /// The slot stored under `hash` for which `eq` holds.
    #[inline]
    pub fn find(&self, hash: u64, eq: impl Fn(u32) -> bool) -> Option<u32> {
        let tag = tag_of(hash);
        for entry in self.shard(tag).from_home(tag) {
            if entry.slot == EMPTY || entry.tag > tag {
                return None;
            }
            if entry.tag == tag && eq(entry.slot) {
                return Some(entry.slot);
            }
        }
        None
    }

    /// Starts loading the line where a lookup of `hash` begins, so that a
    /// loop over known keys waits for memory once per several keys.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        let tag = tag_of(hash);
        if let Some(entry) = self.shard(tag).from_home(tag).first() {
            prefetch(entry);
        }
    }

    /// The slots stored under `hash`'s tag, without checking their keys:
    /// what a caller may prefetch before it looks `hash` up.
    #[inline]
    pub fn candidates(&self, hash: u64) -> impl Iterator<Item = u32> + '_ {
        let tag = tag_of(hash);
        self.shard(tag)
            .from_home(tag)
            .iter()
            .take_while(move |e| e.slot != EMPTY && e.tag <= tag)
            .filter(move |e| e.tag == tag)
            .map(|e| e.slot)
    }

    /// Adds `slot` under `hash`; the caller knows it is not there yet.
    pub fn insert(&mut self, hash: u64, slot: u32) {
        debug_assert!(slot != EMPTY);
        let tag = tag_of(hash);
        self.shards[shard_of(tag)].insert(tag, slot);
        self.len += 1;
    }

    /// Removes the entry of `slot` stored under `hash`; false if absent.
    pub fn remove(&mut self, hash: u64, slot: u32) -> bool {
        let tag = tag_of(hash);
        let removed = self.shards[shard_of(tag)].remove(tag, slot);
        self.len -= usize::from(removed);
        removed
    }

    /// Rewrites every slot with `remap`, dropping those it maps to None.
    pub fn remap(&mut self, remap: impl Fn(u32) -> Option<u32>) {
        for shard in &mut self.shards {
            shard.remap(&remap);
        }
        self.len = self.shards.iter().map(|s| s.len).sum();
    }

    /// Bytes of the entry arrays.
    pub fn heap_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.entries.capacity() * std::mem::size_of::<Entry>())
            .sum()
    }
}

/// Starts loading the cache line of `value`.
#[inline]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is part of x86_64, and a prefetch of a valid reference
        // only hints the cache.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

//! A hash table from a 64-bit key to an arena slot, built for indexes that
//! outgrow the CPU cache. Each entry is 8 bytes, the slot and 32 bits of the
//! key's hash (its tag), so a probe reads one cache line, not a control byte
//! line and then a bucket line. An entry's home is the top bits of its tag,
//! and each run of entries is kept sorted by tag (ordered linear probing):
//! a lookup stops at the first larger tag, and growing the table is a
//! sequential pass that never reads the keys.
//!
//! Growth is spread over inserts. Once the table is 3/4 full, room for a
//! table of twice the homes is reserved (untouched, so nothing is written up
//! front), and each insert moves the next `STEP` old positions into it,
//! whole runs at a time, writing its free entries only as far as the moved
//! runs reach. An old home below the cursor `moved` has been moved, so every
//! key lives in exactly one of the two tables and a lookup probes one: which
//! is a comparison with the cursor. By the time the move ends the old table
//! has taken at most 1/8 more entries, so it never passes 7/8 full.

const EMPTY: u32 = u32::MAX;
/// Entries past the last home, so that no run wraps around.
const TAIL: usize = 64;
/// Old positions moved into the doubled table per insert while growing:
/// the move takes a quarter as many inserts as the old table has homes.
const STEP: usize = 4;

#[derive(Copy, Clone)]
struct Entry {
    tag: u32,
    slot: u32,
}

const FREE: Entry = Entry {
    tag: 0,
    slot: EMPTY,
};

/// The tag of a key hash: its top 32 bits.
fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

fn home(tag: u32, bits: u32) -> usize {
    (u64::from(tag) >> (32 - bits)) as usize
}

/// Whether a probe for `tag` stops at `e`: a free entry or a larger tag.
fn ends_run(e: &Entry, tag: u32) -> bool {
    e.slot == EMPTY || e.tag > tag
}

#[derive(Default)]
pub struct SlotTable {
    entries: Vec<Entry>,
    /// log2 of the number of homes of `entries`; 0 while nothing is allocated.
    bits: u32,
    /// While growing, the table of twice the homes, written as far as the
    /// moved runs reach (and always one free entry past the last used);
    /// empty otherwise.
    grown: Vec<Entry>,
    /// The old homes below this live in `grown`; 0 while not growing.
    moved: usize,
    len: usize,
}

impl SlotTable {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The entries from `tag`'s home on, in the table that holds it (none
    /// while nothing is allocated: home 0 of an empty table).
    #[inline]
    fn from_home(&self, tag: u32) -> &[Entry] {
        let old = home(tag, self.bits);
        if old < self.moved {
            &self.grown[home(tag, self.bits + 1)..]
        } else {
            &self.entries[old..]
        }
    }

    /// The slot stored under `hash` for which `eq` holds.
    #[inline]
    pub fn find(&self, hash: u64, eq: impl Fn(u32) -> bool) -> Option<u32> {
        let tag = tag_of(hash);
        for entry in self.from_home(tag) {
            if ends_run(entry, tag) {
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
        if let Some(entry) = self.from_home(tag_of(hash)).first() {
            prefetch(entry);
        }
    }

    /// The slots stored under `hash`'s tag, without checking their keys:
    /// what a caller may prefetch before it looks `hash` up.
    #[inline]
    pub fn candidates(&self, hash: u64) -> impl Iterator<Item = u32> + '_ {
        let tag = tag_of(hash);
        self.from_home(tag)
            .iter()
            .take_while(move |e| !ends_run(e, tag))
            .filter(move |e| e.tag == tag)
            .map(|e| e.slot)
    }

    /// Adds `slot` under `hash`; the caller knows it is not there yet.
    pub fn insert(&mut self, hash: u64, slot: u32) {
        debug_assert!(slot != EMPTY);
        if self.bits == 0 {
            self.rebuild(4, std::iter::empty());
        } else if self.growing() {
            self.move_runs(STEP);
        } else if (self.len + 1) * 4 > 3 << self.bits {
            self.grown = Vec::with_capacity((2usize << self.bits) + TAIL);
            self.move_runs(STEP);
        }
        let tag = tag_of(hash);
        loop {
            let old = home(tag, self.bits);
            let in_grown = old < self.moved;
            let (entries, start) = if in_grown {
                (&mut self.grown, home(tag, self.bits + 1))
            } else {
                (&mut self.entries, old)
            };
            let place = start
                + entries[start..]
                    .iter()
                    .position(|e| ends_run(e, tag))
                    .expect("a free entry follows the last used one");
            let free = place
                + entries[place..]
                    .iter()
                    .position(|e| e.slot == EMPTY)
                    .expect("a free entry follows the last used one");
            if free + 1 == entries.len() {
                if in_grown && entries.len() < entries.capacity() {
                    let more = (entries.len() + TAIL).min(entries.capacity());
                    entries.resize(more, FREE);
                } else {
                    self.resize(self.bits + 1);
                }
                continue;
            }
            entries.copy_within(place..free, place + 1);
            entries[place] = Entry { tag, slot };
            self.len += 1;
            return;
        }
    }

    fn growing(&self) -> bool {
        self.grown.capacity() > 0
    }

    /// Writes free entries into the grown table up to `len` of them.
    fn fill_grown(&mut self, len: usize) {
        let len = len.min(self.grown.capacity());
        if self.grown.len() < len {
            self.grown.resize(len, FREE);
        }
    }

    /// Moves at least `positions` old positions into the grown table, up to
    /// a free one, so that no run is split: every entry before a free
    /// position has its home before it. Ends the growth once all are moved.
    fn move_runs(&mut self, positions: usize) {
        let homes = 1usize << self.bits;
        let target = (self.moved + positions).min(homes);
        let mut at = self.moved;
        while at < target || self.entries[at].slot != EMPTY {
            let entry = std::mem::replace(&mut self.entries[at], FREE);
            at += 1;
            if entry.slot == EMPTY {
                continue;
            }
            let start = home(entry.tag, self.bits + 1);
            self.fill_grown(start + 2);
            // Entries already there have smaller homes, so smaller tags.
            let place = start
                + self.grown[start..]
                    .iter()
                    .position(|g| g.slot == EMPTY)
                    .expect("a free entry follows the last used one");
            self.fill_grown(place + 2);
            if place + 1 == self.grown.len() {
                self.entries[at - 1] = entry;
                self.moved = at - 1;
                self.resize(self.bits + 1);
                return;
            }
            self.grown[place] = entry;
        }
        self.moved = at;
        self.fill_grown(2 * at + 2);
        if at >= homes {
            self.fill_grown(usize::MAX);
            self.entries = std::mem::take(&mut self.grown);
            self.bits += 1;
            self.moved = 0;
        }
    }

    /// Removes the entry of `slot` stored under `hash`; false if absent.
    pub fn remove(&mut self, hash: u64, slot: u32) -> bool {
        if self.len == 0 {
            return false;
        }
        let tag = tag_of(hash);
        let old = home(tag, self.bits);
        let (entries, start, bits) = if old < self.moved {
            (&mut self.grown, home(tag, self.bits + 1), self.bits + 1)
        } else {
            (&mut self.entries, old, self.bits)
        };
        let Some(at) = entries[start..]
            .iter()
            .take_while(|e| !ends_run(e, tag))
            .position(|e| e.tag == tag && e.slot == slot)
        else {
            return false;
        };
        let mut hole = start + at;
        // Backward shift: pull displaced followers one step toward home.
        loop {
            let next = entries[hole + 1];
            if next.slot == EMPTY || home(next.tag, bits) > hole {
                break;
            }
            entries[hole] = next;
            hole += 1;
        }
        entries[hole] = FREE;
        self.len -= 1;
        true
    }

    /// Rewrites every slot with `remap`, dropping those it maps to None.
    pub fn remap(&mut self, remap: impl Fn(u32) -> Option<u32>) {
        let kept: Vec<Entry> = self
            .live()
            .filter_map(|e| remap(e.slot).map(|slot| Entry { tag: e.tag, slot }))
            .collect();
        self.rebuild(bits_for(kept.len()), kept.into_iter());
    }

    /// Bytes of the entry arrays.
    pub fn heap_bytes(&self) -> usize {
        (self.entries.capacity() + self.grown.capacity()) * std::mem::size_of::<Entry>()
    }

    /// Live entries in tag order: the moved ones (smaller homes) first.
    fn live(&self) -> impl Iterator<Item = Entry> + '_ {
        self.grown
            .iter()
            .chain(&self.entries)
            .copied()
            .filter(|e| e.slot != EMPTY)
    }

    fn resize(&mut self, bits: u32) {
        let live: Vec<Entry> = self.live().collect();
        self.rebuild(bits, live.into_iter());
    }

    /// Lays `entries`, in tag order, into a table of 2^bits homes: each goes
    /// to its home or just after the one before, in one pass. Ends a growth.
    fn rebuild(&mut self, bits: u32, entries: impl Iterator<Item = Entry> + Clone) {
        self.grown = Vec::new();
        self.moved = 0;
        let mut bits = bits;
        'sized: loop {
            self.bits = bits;
            self.entries = if bits == 0 {
                Vec::new()
            } else {
                vec![FREE; (1usize << bits) + TAIL]
            };
            self.len = 0;
            let mut next = 0usize;
            for entry in entries.clone() {
                let at = next.max(home(entry.tag, bits));
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

/// Homes for `len` entries at most 3/4 full, rounded to a power of two.
fn bits_for(len: usize) -> u32 {
    if len == 0 {
        return 0;
    }
    let homes = (len * 4).div_ceil(3).next_power_of_two().max(16);
    homes.trailing_zeros()
}

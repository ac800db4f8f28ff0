//! A hash table from a 64-bit key to an arena slot, built for indexes that
//! outgrow the CPU cache. Each entry is 8 bytes, the slot and 32 bits of the
//! key's hash (its tag), so a probe reads one cache line, not a control byte
//! line and then a bucket line. An entry's home is the top bits of its tag,
//! and each run of entries is kept sorted by tag (ordered linear probing):
//! a lookup stops at the first larger tag, and growing the table is one
//! sequential pass that never reads the keys.

use super::huge_pages::advise_huge_pages;

const EMPTY: u32 = u32::MAX;
/// Entries past the last home, so that no run wraps around.
const TAIL: usize = 64;

#[derive(Copy, Clone)]
struct Entry {
    tag: u32,
    slot: u32,
}

const FREE: Entry = Entry {
    tag: 0,
    slot: EMPTY,
};

#[derive(Default)]
pub struct SlotTable {
    entries: Vec<Entry>,
    /// log2 of the number of homes; 0 while nothing is allocated.
    bits: u32,
    len: usize,
    /// The fewest homes the table keeps (log2), from [`SlotTable::reserve`]:
    /// a remap never shrinks it below them.
    reserved_bits: u32,
}

/// Where an entry tagged `tag` belongs in a table of 2^bits homes: the
/// tag's top bits.
fn home_of(tag: u32, bits: u32) -> usize {
    (u64::from(tag) >> (32 - bits)) as usize
}

/// The tag of a key hash: its top 32 bits.
fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

impl SlotTable {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    fn home(&self, tag: u32) -> usize {
        home_of(tag, self.bits)
    }

    /// The slot stored under `hash` for which `eq` holds.
    #[inline]
    pub fn find(&self, hash: u64, eq: impl Fn(u32) -> bool) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        self.probe(tag_of(hash), eq).ok()
    }

    /// Ok(the slot stored under `tag` for which `eq` holds), else Err(where
    /// an entry tagged `tag` goes: the first entry of its run that is free
    /// or has a larger tag). The table must be allocated.
    #[inline]
    fn probe(&self, tag: u32, eq: impl Fn(u32) -> bool) -> Result<u32, usize> {
        let start = self.home(tag);
        for (offset, entry) in self.entries[start..].iter().enumerate() {
            if entry.slot == EMPTY || entry.tag > tag {
                return Err(start + offset);
            }
            if entry.tag == tag && eq(entry.slot) {
                return Ok(entry.slot);
            }
        }
        unreachable!("the last entry is always free")
    }

    /// Starts loading the line where a lookup of `hash` begins, so that a
    /// loop over known keys waits for memory once per several keys.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        if self.len > 0 {
            prefetch(&self.entries[self.home(tag_of(hash))]);
        }
    }

    /// The slots stored under `hash`'s tag, without checking their keys:
    /// what a caller may prefetch before it looks `hash` up.
    #[inline]
    pub fn candidates(&self, hash: u64) -> impl Iterator<Item = u32> + '_ {
        let tag = tag_of(hash);
        let start = if self.len == 0 {
            self.entries.len()
        } else {
            self.home(tag)
        };
        self.entries[start..]
            .iter()
            .take_while(move |e| e.slot != EMPTY && e.tag <= tag)
            .filter(move |e| e.tag == tag)
            .map(|e| e.slot)
    }

    /// Every entry's tag and slot, in table order.
    pub fn entries(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.entries
            .iter()
            .filter(|e| e.slot != EMPTY)
            .map(|e| (e.tag, e.slot))
    }

    /// Grows the table to at least `homes` homes at once (at most 2^31),
    /// and keeps it at least that big until reserved again: it then takes
    /// 7/8 of them in entries without doubling, which rewrites the whole
    /// table in one insert and at millions of entries stalls the caller.
    /// A smaller reservation shrinks the table by the rule a remap follows.
    pub fn reserve(&mut self, homes: usize) {
        self.keep_reserved(homes);
        if let Some(bits) = self.resize_for(homes) {
            self.resize(bits);
        }
    }

    /// Records a reservation of `homes` without remaking the table: what
    /// [`SlotTable::reserve`] does once a table of the right size is in
    /// place (see `sizing.rs`).
    pub fn keep_reserved(&mut self, homes: usize) {
        self.reserved_bits = reserved_bits(homes);
    }

    /// The log2 of the homes [`SlotTable::reserve`] would remake the table
    /// with for `homes`; None where it keeps the table as it is.
    pub fn resize_for(&self, homes: usize) -> Option<u32> {
        let bits = reserved_bits(homes);
        let fits = bits_for(self.len).max(bits);
        (bits > self.bits || fits + 1 < self.bits).then_some(fits)
    }

    /// Whether the table is smaller than a reservation of `homes` keeps it.
    pub fn is_under(&self, homes: usize) -> bool {
        reserved_bits(homes) > self.bits
    }

    /// This table's entries laid into `blank`, as a table reserved for
    /// `homes`: the table [`SlotTable::reserve`] would remake, built while
    /// lookups of this one go on. None if `blank` is not of the size that
    /// reservation takes, or its entries do not fit (no free tail).
    pub fn laid_into(&self, homes: usize, mut blank: BlankTable) -> Option<SlotTable> {
        if self.resize_for(homes) != Some(blank.bits) {
            return None;
        }
        let len = lay(&mut blank.entries, blank.bits, self.live_entries())?;
        Some(SlotTable {
            entries: blank.entries,
            bits: blank.bits,
            len,
            reserved_bits: reserved_bits(homes),
        })
    }

    /// Adds `slot` under `hash`; the caller knows it is not there yet.
    pub fn insert(&mut self, hash: u64, slot: u32) {
        debug_assert!(slot != EMPTY);
        if self.is_full() {
            self.resize(self.bits.max(3) + 1);
        }
        let tag = tag_of(hash);
        self.insert_at(tag, slot, self.place_of(tag));
    }

    /// Where an entry tagged `tag` goes (see [`SlotTable::probe`]).
    fn place_of(&self, tag: u32) -> usize {
        self.probe(tag, |_| false)
            .expect_err("no entry is equal to nothing")
    }

    /// The slot stored under `hash` for which `eq` holds; when there is
    /// none, adds `slot` under `hash` and returns None. One probe where a
    /// find and then an insert would take two.
    #[inline]
    pub fn find_or_insert(
        &mut self,
        hash: u64,
        slot: u32,
        eq: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        debug_assert!(slot != EMPTY);
        if self.is_full() {
            if let Some(found) = self.find(hash, eq) {
                return Some(found);
            }
            self.insert(hash, slot);
            return None;
        }
        let tag = tag_of(hash);
        match self.probe(tag, eq) {
            Ok(found) => Some(found),
            Err(place) => {
                self.insert_at(tag, slot, place);
                None
            }
        }
    }

    fn is_full(&self) -> bool {
        self.bits == 0 || (self.len + 1) * 8 > (7 << self.bits)
    }

    /// Adds `slot` with `tag` at `place` (see [`SlotTable::place_of`]),
    /// shifting the rest of the run up by one.
    fn insert_at(&mut self, tag: u32, slot: u32, mut place: usize) {
        loop {
            let free = place
                + self.entries[place..]
                    .iter()
                    .position(|e| e.slot == EMPTY)
                    .expect("the last entry is always free");
            if free + 1 == self.entries.len() {
                self.resize(self.bits + 1);
                place = self.place_of(tag);
                continue;
            }
            // Runs are short: moving entries one by one beats a memmove call.
            for at in (place..free).rev() {
                self.entries[at + 1] = self.entries[at];
            }
            self.entries[place] = Entry { tag, slot };
            self.len += 1;
            return;
        }
    }

    /// Removes the entry of `slot` stored under `hash`; false if absent.
    pub fn remove(&mut self, hash: u64, slot: u32) -> bool {
        if self.len == 0 {
            return false;
        }
        let tag = tag_of(hash);
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

    /// Rewrites every slot with `remap`, dropping those it maps to None, in
    /// place: each kept entry moves to its home or just after the one
    /// before, which is never past where it was. The table shrinks only
    /// when it is over twice the size its entries need.
    pub fn remap(&mut self, remap: impl Fn(u32) -> Option<u32>) {
        let mut next = 0usize;
        let mut len = 0usize;
        for read in 0..self.entries.len() {
            let entry = self.entries[read];
            if entry.slot == EMPTY {
                continue;
            }
            self.entries[read] = FREE;
            if let Some(slot) = remap(entry.slot) {
                let at = next.max(self.home(entry.tag));
                self.entries[at] = Entry {
                    tag: entry.tag,
                    slot,
                };
                next = at + 1;
                len += 1;
            }
        }
        self.len = len;
        let fits = bits_for(len).max(self.reserved_bits);
        if fits + 1 < self.bits {
            self.resize(fits);
        }
    }

    /// The address of the entry array's middle, for tests of how it is
    /// mapped.
    #[cfg(test)]
    pub fn middle_address(&self) -> usize {
        self.entries[self.entries.len() / 2..].as_ptr() as usize
    }

    /// Bytes of the entry array.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    fn live_entries(&self) -> impl Iterator<Item = Entry> + '_ {
        self.entries.iter().copied().filter(|e| e.slot != EMPTY)
    }

    fn resize(&mut self, bits: u32) {
        let old = std::mem::take(&mut self.entries);
        self.rebuild(bits, old.into_iter().filter(|e| e.slot != EMPTY));
    }

    /// Lays `entries`, in tag order, into a table of 2^bits homes, or more
    /// where they do not fit.
    fn rebuild(&mut self, bits: u32, entries: impl Iterator<Item = Entry> + Clone) {
        let mut bits = bits.max(if self.len > 0 { 4 } else { 0 });
        loop {
            let mut blank = BlankTable::new(bits);
            if let Some(len) = lay(&mut blank.entries, bits, entries.clone()) {
                self.entries = blank.entries;
                self.bits = bits;
                self.len = len;
                return;
            }
            bits += 1;
        }
    }
}

/// A table's worth of free entries, written and advised for huge pages:
/// what makes a big table slow to make (its page faults), taken apart from
/// the table so that it can be made under no lock (`sizing.rs`).
pub struct BlankTable {
    bits: u32,
    entries: Vec<Entry>,
}

impl BlankTable {
    pub fn new(bits: u32) -> Self {
        Self::written(bits, false)
    }

    /// The same, written a step at a time with the CPU yielded between:
    /// for a thread that holds no lock while it writes and shares a small
    /// machine with the threads serving lookups.
    pub fn new_yielding(bits: u32) -> Self {
        Self::written(bits, true)
    }

    fn written(bits: u32, yielding: bool) -> Self {
        let len = (1usize << bits) + TAIL;
        let mut entries = Vec::with_capacity(len);
        while entries.len() < len {
            let step = if yielding { YIELD_EVERY } else { len };
            entries.extend(std::iter::repeat_n(FREE, step.min(len - entries.len())));
            if yielding {
                std::thread::yield_now();
            }
        }
        advise_huge_pages(&entries);
        BlankTable { bits, entries }
    }
}

/// Entries a yielding blank writes between yields: 1 MiB, about half a
/// millisecond of page faults.
const YIELD_EVERY: usize = (1 << 20) / std::mem::size_of::<Entry>();

/// Lays `entries`, in tag order, into the free `table` of 2^bits homes:
/// each goes to its home or just after the one before, in one pass.
/// Returns how many it laid, or None where they run past the table's end.
fn lay(table: &mut [Entry], bits: u32, entries: impl Iterator<Item = Entry>) -> Option<usize> {
    let mut next = 0usize;
    let mut len = 0usize;
    for entry in entries {
        let at = next.max(home_of(entry.tag, bits));
        if at + 1 >= table.len() {
            return None;
        }
        table[at] = entry;
        len += 1;
        next = at + 1;
    }
    Some(len)
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

/// The log2 of the homes a reservation of `homes` keeps (at least 16, at
/// most 2^31).
fn reserved_bits(homes: usize) -> u32 {
    homes
        .clamp(16, 1 << 31)
        .next_power_of_two()
        .trailing_zeros()
}

/// Homes for `len` entries at most 7/8 full, rounded to a power of two.
fn bits_for(len: usize) -> u32 {
    if len == 0 {
        return 0;
    }
    let homes = (len * 8).div_ceil(7).next_power_of_two().max(16);
    homes.trailing_zeros()
}

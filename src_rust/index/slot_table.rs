//! A hash table from a 64-bit key to an arena slot, built for indexes that
//! outgrow the CPU cache. Each entry is 8 bytes, the slot and 32 bits of the
//! key's hash (its tag), and eight entries make a bucket of one cache line.
//! An entry's home bucket is the top bits of its tag; a full bucket's
//! overflow goes to the next one (linear probing by buckets). So a probe
//! reads one line and compares its eight tags at once. A table is 7/16 to
//! 7/8 full, about half where reserved for the workers' capacity; at half
//! load a bucket holds four entries on average and is seldom full, so a
//! probe mostly ends in its home bucket on a branch the CPU predicts, and a
//! removal seldom moves another entry. Growing the table is one pass that
//! never reads the keys.

use super::huge_pages::advise_huge_pages;

const EMPTY: u32 = u32::MAX;
/// Entries in a bucket: 64 bytes, a cache line.
const BUCKET: usize = 8;
/// Buckets past the last home, so that no overflow wraps around. The last
/// bucket is always free, so every probe ends. Keys crowding the last
/// homes lengthen the tail rather than double the table (see
/// [`SlotTable::insert_at`]).
const TAIL_BUCKETS: usize = 8;

#[derive(Copy, Clone)]
struct Entry {
    tag: u32,
    slot: u32,
}

const FREE: Entry = Entry {
    tag: 0,
    slot: EMPTY,
};

/// Eight entries in one cache line, their tags together and their slots
/// together, so that a probe compares the eight tags in two vector
/// compares.
#[derive(Copy, Clone)]
#[repr(C, align(64))]
struct Bucket {
    tags: [u32; BUCKET],
    slots: [u32; BUCKET],
}

const FREE_BUCKET: Bucket = Bucket {
    tags: [FREE.tag; BUCKET],
    slots: [FREE.slot; BUCKET],
};

impl Bucket {
    fn get(&self, at: usize) -> Entry {
        Entry {
            tag: self.tags[at],
            slot: self.slots[at],
        }
    }

    fn set(&mut self, at: usize, entry: Entry) {
        self.tags[at] = entry.tag;
        self.slots[at] = entry.slot;
    }

    fn iter(&self) -> impl Iterator<Item = Entry> + Clone + '_ {
        (0..BUCKET).map(|at| self.get(at))
    }

    /// A bit per entry tagged `tag`.
    #[inline]
    fn tagged(&self, tag: u32) -> u32 {
        equal_lanes(&self.tags, tag) & !self.free()
    }

    /// A bit per free entry.
    #[inline]
    fn free(&self) -> u32 {
        equal_lanes(&self.slots, EMPTY)
    }

    fn is_full(&self) -> bool {
        self.free() == 0
    }
}

/// A bit per lane of `lanes` equal to `value`.
#[inline]
fn equal_lanes(lanes: &[u32; BUCKET], value: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            _mm_cmpeq_epi32, _mm_loadu_si128, _mm_movemask_epi8, _mm_packs_epi16, _mm_packs_epi32,
            _mm_set1_epi32, _mm_setzero_si128,
        };
        // SAFETY: SSE2 is part of x86_64; the two loads read the array's
        // 32 bytes.
        unsafe {
            let wanted = _mm_set1_epi32(value as i32);
            let low = _mm_cmpeq_epi32(_mm_loadu_si128(lanes.as_ptr().cast()), wanted);
            let high = _mm_cmpeq_epi32(_mm_loadu_si128(lanes.as_ptr().add(4).cast()), wanted);
            // Lanes of all ones or zeros stay so when narrowed: eight bytes.
            let bytes = _mm_packs_epi16(_mm_packs_epi32(low, high), _mm_setzero_si128());
            _mm_movemask_epi8(bytes) as u32
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut bits = 0;
        for (i, &lane) in lanes.iter().enumerate() {
            bits |= u32::from(lane == value) << i;
        }
        bits
    }
}

/// The lowest set bit's entry of a bucket's bitmask.
fn first(bits: u32) -> usize {
    bits.trailing_zeros() as usize
}

/// An entry's place: its bucket and its position in it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Place {
    bucket: usize,
    at: usize,
}

#[derive(Default)]
pub struct SlotTable {
    buckets: Vec<Bucket>,
    /// log2 of the number of homes: the entries of the buckets that are
    /// some tag's home, the tail aside; 0 while nothing is allocated.
    bits: u32,
    len: usize,
    /// The fewest homes the table keeps (log2), from [`SlotTable::reserve`]:
    /// a remap never shrinks it below them.
    reserved_bits: u32,
}

/// The home bucket of an entry tagged `tag` in a table of 2^bits homes: the
/// tag's top bits.
fn home_of(tag: u32, bits: u32) -> usize {
    let bucket_bits = bits.saturating_sub(BUCKET.trailing_zeros());
    (u64::from(tag) >> (32 - bucket_bits)) as usize
}

/// Buckets of a table of 2^bits homes with a tail of `tail` buckets (a
/// table of fewer homes than a bucket, which holds no entry, is its tail
/// alone).
fn buckets_for(bits: u32, tail: usize) -> usize {
    (1usize << bits) / BUCKET + tail
}

/// The tag of a key hash: its top 32 bits.
fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// Where an entry tagged `tag` goes in `buckets`: the first free entry of
/// the first bucket from its home that is not full; None in the last
/// bucket, which must stay free.
fn free_place(buckets: &[Bucket], tag: u32, bits: u32) -> Option<Place> {
    let mut bucket = home_of(tag, bits);
    loop {
        let free = buckets[bucket].free();
        if free != 0 {
            return (bucket + 1 < buckets.len()).then(|| Place {
                bucket,
                at: first(free),
            });
        }
        bucket += 1;
    }
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
    /// an entry tagged `tag` goes: a free entry of the first bucket from its
    /// home that is not full). The table must be allocated.
    #[inline]
    fn probe(&self, tag: u32, eq: impl Fn(u32) -> bool) -> Result<u32, Place> {
        let mut bucket = self.home(tag);
        loop {
            let entries = &self.buckets[bucket];
            let mut tagged = entries.tagged(tag);
            while tagged != 0 {
                let slot = entries.slots[first(tagged)];
                if eq(slot) {
                    return Ok(slot);
                }
                tagged &= tagged - 1;
            }
            let free = entries.free();
            if free != 0 {
                return Err(Place {
                    bucket,
                    at: first(free),
                });
            }
            bucket += 1;
        }
    }

    /// Starts loading the line where a lookup of `hash` begins, so that a
    /// loop over known keys waits for memory once per several keys.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        if self.len > 0 {
            prefetch(&self.buckets[self.home(tag_of(hash))]);
        }
    }

    /// The first slot stored under `hash`'s tag in its home bucket, without
    /// checking its key: what a caller may prefetch before it looks `hash`
    /// up. A hint: a second entry of the tag, or one that overflowed the
    /// home bucket, is left out.
    #[inline]
    pub fn candidate(&self, hash: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let tag = tag_of(hash);
        let entries = &self.buckets[self.home(tag)];
        let tagged = entries.tagged(tag);
        (tagged != 0).then(|| entries.slots[first(tagged)])
    }

    /// Every entry's tag and slot, in table order.
    pub fn entries(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.live_entries().map(|e| (e.tag, e.slot))
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
        let len = lay(&mut blank.buckets, blank.bits, self.live_entries())?;
        Some(SlotTable {
            buckets: blank.buckets,
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
    fn place_of(&self, tag: u32) -> Place {
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

    /// Adds `slot` with `tag` at `place` (see [`SlotTable::place_of`]). Where
    /// that is the last bucket, which stays free, a table at least half full
    /// doubles; one less full has keys crowding its last homes, which a
    /// doubling would not spread (a home near the end stays near the end),
    /// as a worker naming blocks by ids crafted to share a home could make
    /// it double until memory runs out. Its tail doubles instead.
    fn insert_at(&mut self, tag: u32, slot: u32, mut place: Place) {
        while place.bucket + 1 == self.buckets.len() {
            if self.len * 2 >= 1 << self.bits {
                self.resize(self.bits + 1);
            } else {
                let tail = self.buckets.len() - buckets_for(self.bits, 0);
                self.buckets.reserve_exact(tail);
                self.buckets.extend(std::iter::repeat_n(FREE_BUCKET, tail));
            }
            place = self.place_of(tag);
        }
        self.buckets[place.bucket].set(place.at, Entry { tag, slot });
        self.len += 1;
    }

    /// Removes the entry of `slot` stored under `hash`; false if absent.
    pub fn remove(&mut self, hash: u64, slot: u32) -> bool {
        if self.len == 0 {
            return false;
        }
        let tag = tag_of(hash);
        let mut bucket = self.home(tag);
        // Its own walk, not `probe` made to return the entry's place: that
        // made finds on a 10M index 20% slower (the growth bench).
        let at = loop {
            let entries = &self.buckets[bucket];
            let mut tagged = entries.tagged(tag);
            while tagged != 0 && entries.slots[first(tagged)] != slot {
                tagged &= tagged - 1;
            }
            if tagged != 0 {
                break first(tagged);
            }
            if !entries.is_full() {
                return false;
            }
            bucket += 1;
        };
        let was_full = self.buckets[bucket].is_full();
        self.buckets[bucket].set(at, FREE);
        self.len -= 1;
        if was_full {
            self.refill(Place { bucket, at });
        }
        true
    }

    /// Fills `hole`, in a bucket that was full, with an entry that probed
    /// past it, and so on for the hole that leaves, until a bucket that
    /// was not full: no entry probed past that.
    fn refill(&mut self, mut hole: Place) {
        let mut bucket = hole.bucket + 1;
        loop {
            let entries = &self.buckets[bucket];
            let was_full = entries.is_full();
            let bits = self.bits;
            let moved = (0..BUCKET).find(|&at| {
                let entry = entries.get(at);
                entry.slot != EMPTY && home_of(entry.tag, bits) <= hole.bucket
            });
            if let Some(at) = moved {
                let moving = self.buckets[bucket].get(at);
                self.buckets[hole.bucket].set(hole.at, moving);
                self.buckets[bucket].set(at, FREE);
                hole = Place { bucket, at };
            }
            if !was_full {
                return;
            }
            bucket += 1;
        }
    }

    /// Rewrites every slot with `remap`, dropping those it maps to None, in
    /// place: each entry, in table order, is taken out and put back in the
    /// first bucket from its home with room, which is never past where it
    /// was. The table shrinks only when it is over twice the size its
    /// entries need.
    pub fn remap(&mut self, remap: impl Fn(u32) -> Option<u32>) {
        let mut len = 0usize;
        for bucket in 0..self.buckets.len() {
            for at in 0..BUCKET {
                let entry = self.buckets[bucket].get(at);
                if entry.slot == EMPTY {
                    continue;
                }
                self.buckets[bucket].set(at, FREE);
                if let Some(slot) = remap(entry.slot) {
                    let place = free_place(&self.buckets, entry.tag, self.bits)
                        .expect("the entry's own place is free");
                    self.buckets[place.bucket].set(
                        place.at,
                        Entry {
                            tag: entry.tag,
                            slot,
                        },
                    );
                    len += 1;
                }
            }
        }
        self.len = len;
        let fits = bits_for(len).max(self.reserved_bits);
        if fits + 1 < self.bits {
            self.resize(fits);
        }
    }

    /// The address of the bucket array's middle, for tests of how it is
    /// mapped.
    #[cfg(test)]
    pub fn middle_address(&self) -> usize {
        self.buckets[self.buckets.len() / 2..].as_ptr() as usize
    }

    /// Bytes of the bucket array.
    pub fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<Bucket>()
    }

    fn live_entries(&self) -> impl Iterator<Item = Entry> + Clone + '_ {
        live_entries(&self.buckets)
    }

    fn resize(&mut self, bits: u32) {
        let old = std::mem::take(&mut self.buckets);
        self.rebuild(bits, live_entries(&old));
    }

    /// Lays `entries` into a table of 2^bits homes, with a longer tail
    /// where they run past its end (keys crowding the last homes: see
    /// [`SlotTable::insert_at`]).
    fn rebuild(&mut self, bits: u32, entries: impl Iterator<Item = Entry> + Clone) {
        let bits = bits.max(if self.len > 0 { 4 } else { 0 });
        let mut tail = TAIL_BUCKETS;
        loop {
            let mut blank = BlankTable::written(bits, tail, false);
            if let Some(len) = lay(&mut blank.buckets, bits, entries.clone()) {
                self.buckets = blank.buckets;
                self.bits = bits;
                self.len = len;
                return;
            }
            tail *= 2;
        }
    }
}

/// A table's worth of free buckets, written and advised for huge pages:
/// what makes a big table slow to make (its page faults), taken apart from
/// the table so that it can be made under no lock (`sizing.rs`).
pub struct BlankTable {
    bits: u32,
    buckets: Vec<Bucket>,
}

impl BlankTable {
    #[cfg(test)]
    pub fn new(bits: u32) -> Self {
        Self::written(bits, TAIL_BUCKETS, false)
    }

    /// The same, written a step at a time with the CPU yielded between:
    /// for a thread that holds no lock while it writes and shares a small
    /// machine with the threads serving lookups.
    pub fn new_yielding(bits: u32) -> Self {
        Self::written(bits, TAIL_BUCKETS, true)
    }

    fn written(bits: u32, tail: usize, yielding: bool) -> Self {
        let len = buckets_for(bits, tail);
        let mut buckets = Vec::with_capacity(len);
        while buckets.len() < len {
            let step = if yielding { YIELD_EVERY } else { len };
            buckets.extend(std::iter::repeat_n(
                FREE_BUCKET,
                step.min(len - buckets.len()),
            ));
            if yielding {
                std::thread::yield_now();
            }
        }
        advise_huge_pages(&buckets);
        BlankTable { bits, buckets }
    }
}

/// Buckets a yielding blank writes between yields: 1 MiB, about half a
/// millisecond of page faults.
const YIELD_EVERY: usize = (1 << 20) / std::mem::size_of::<Bucket>();

/// The entries of `buckets` that are not free, in table order.
fn live_entries(buckets: &[Bucket]) -> impl Iterator<Item = Entry> + Clone + '_ {
    buckets
        .iter()
        .flat_map(|bucket| bucket.iter())
        .filter(|e| e.slot != EMPTY)
}

/// Lays `entries` into the free `buckets` of 2^bits homes, each in the
/// first bucket from its home with room; entries in table order write
/// the new table front to back. Returns how many it laid, or None where
/// they reach the last bucket.
fn lay(buckets: &mut [Bucket], bits: u32, entries: impl Iterator<Item = Entry>) -> Option<usize> {
    let mut len = 0usize;
    for entry in entries {
        let place = free_place(buckets, entry.tag, bits)?;
        buckets[place.bucket].set(place.at, entry);
        len += 1;
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

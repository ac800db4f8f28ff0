//! Transparent huge pages for the index's hash tables, which outgrow the
//! CPU cache at millions of blocks. Each lookup probes a random line of a
//! table of up to hundreds of megabytes: under 2 MiB pages it misses the
//! TLB far less often than under 4 KiB ones. Kernels set to `madvise`
//! (Debian's and Ubuntu's default) give huge pages only where asked; under
//! `always` the advice changes nothing and under `never` it is ignored.
//!
//! A table is advised once it has been written, never before. A first
//! touch of an advised range asks for a whole huge page, and under the
//! default `defrag` setting (`madvise`) the kernel compacts memory to find
//! one inside the fault: on this project's 2-core machine, once its memory
//! was fragmented, the apply call holding the doubling of a table at 7.3M
//! entries (one insert, under the index's write lock) took 1.0–2.2 s
//! advised first against 0.16–0.35 s written first (`bench/index_bench.py
//! --only trace`, two runs each). Written first, the table is faulted in small
//! pages, and khugepaged merges them into huge pages in the background, a
//! few megabytes every few seconds: the lookups of a long-lived index gain,
//! and no insert waits for compaction.
//!
//! Only buffers filled whole as soon as they are made are advised: a
//! vector growing by pushes would have its partly used last range merged
//! and kept resident whole (the arena's vectors advised took about one
//! more byte per block).

/// Buffers from this size on are advised; smaller ones rarely span a whole
/// aligned huge page.
const ADVISED_FROM_BYTES: usize = 4 << 20;
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks for huge pages under the whole 2 MiB pages of `buffer`'s capacity.
/// Call it once the buffer is written (see above).
pub fn advise_huge_pages<T>(buffer: &Vec<T>) {
    let len = buffer.capacity() * std::mem::size_of::<T>();
    #[cfg(target_os = "linux")]
    if len >= ADVISED_FROM_BYTES {
        let start = (buffer.as_ptr() as usize).next_multiple_of(HUGE_PAGE_BYTES);
        let end = (buffer.as_ptr() as usize + len) & !(HUGE_PAGE_BYTES - 1);
        // SAFETY: [start, end) lies inside the buffer's allocation, which
        // is at least two huge pages long. The advice is a hint: if the
        // kernel refuses it the pages stay small.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = len;
}

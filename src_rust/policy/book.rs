//! The load book: what the router itself has sent to each worker and not yet
//! seen finish. Charging at routing time is what spreads a burst of requests
//! before any worker has reported load. Router replicas share their
//! bookings: a peer's are kept apart, by replica, and counted in the same
//! per-worker totals.

use super::active_blocks::ActiveBlocks;
use crate::ids::{SeqHash, WorkerId};
use hashbrown::HashMap;
use std::collections::VecDeque;

/// Load the router has charged to one worker.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Booked {
    pub prefill_tokens: u64,
    pub decode_blocks: u64,
    pub requests: u64,
}

/// One routed request's charges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Booking {
    /// Where the prefill tokens are charged (the decode worker when local).
    pub prefill_worker: WorkerId,
    pub decode_worker: WorkerId,
    pub prefill_tokens: u64,
    pub decode_blocks: u64,
    pub prefill_open: bool,
    pub at_ms: u64,
}

#[derive(Default, Debug)]
pub struct LoadBook {
    bookings: HashMap<String, Booking>,
    per_worker: HashMap<WorkerId, Booked>,
    /// Routing order, for expiry: (time, request id). Entries whose request
    /// already left the book are skipped when reached, and swept out once
    /// they outnumber the live ones, so the queue follows the requests in
    /// flight rather than the routing rate times `stale_after`.
    order: VecDeque<(u64, String)>,
    /// The same per decode worker, for `retire_unreported`; swept alike.
    decode_order: HashMap<WorkerId, VecDeque<(u64, String)>>,
    /// Peer replicas' bookings, by replica and request id. They lapse when
    /// the peer says so (a release, or a whole book without them), or when
    /// the peer is dropped for going silent.
    remote: HashMap<String, HashMap<String, Booking>>,
    /// The prompt blocks of the own bookings charged with them, by request
    /// id, and their distinct blocks per decode worker.
    blocks: HashMap<String, Vec<SeqHash>>,
    active: ActiveBlocks,
}

/// Finished entries the expiry queue may hold beyond the live bookings
/// before it is swept.
const ORDER_SLACK: usize = 1024;

impl LoadBook {
    pub fn booked(&self, worker: WorkerId) -> Booked {
        self.per_worker.get(&worker).copied().unwrap_or_default()
    }

    /// The decode blocks booked on the worker with each block shared by
    /// several active requests counted once (as far as their blocks are
    /// known: a peer's bookings count in full).
    pub fn active_blocks(&self, worker: WorkerId) -> u64 {
        self.booked(worker)
            .decode_blocks
            .saturating_sub(self.active.booked(worker))
            + self.active.distinct(worker)
    }

    /// How many of `blocks` an active request booked on the worker holds.
    pub fn active_shared(&self, worker: WorkerId, blocks: &[SeqHash]) -> u64 {
        self.active.shared(worker, blocks)
    }

    pub fn contains(&self, request_id: &str) -> bool {
        self.bookings.contains_key(request_id)
    }

    pub fn len(&self) -> usize {
        self.bookings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bookings.is_empty()
    }

    /// This router's bookings, by request id.
    pub fn own(&self) -> impl Iterator<Item = (&String, &Booking)> {
        self.bookings.iter()
    }

    /// The prompt blocks the decode worker holds while the request is
    /// active: booked in full per request (`booked`), and counted once
    /// however many active requests share them (`active_blocks`); pass none
    /// when nothing reads the distinct count.
    pub fn charge(&mut self, request_id: String, booking: Booking, blocks: &[SeqHash]) {
        credit(&mut self.per_worker, &booking);
        if !blocks.is_empty() {
            self.active.add(booking.decode_worker, blocks);
            self.blocks.insert(request_id.clone(), blocks.to_vec());
        }
        if self.order.len() > 2 * self.bookings.len() + ORDER_SLACK {
            let bookings = &self.bookings;
            self.order
                .retain(|(at, id)| bookings.get(id).is_some_and(|b| b.at_ms == *at));
        }
        self.order.push_back((booking.at_ms, request_id.clone()));
        let queue = self.decode_order.entry(booking.decode_worker).or_default();
        if queue.len() > 2 * self.per_worker[&booking.decode_worker].requests as usize + ORDER_SLACK
        {
            let bookings = &self.bookings;
            queue.retain(|(at, id)| bookings.get(id).is_some_and(|b| b.at_ms == *at));
        }
        queue.push_back((booking.at_ms, request_id.clone()));
        self.bookings.insert(request_id, booking);
    }

    /// Releases this router's bookings on `worker` that its own report no
    /// longer accounts for: of the bookings routed to it before `horizon_ms`
    /// that it should hold by now (prefilled there, or prefill done), the
    /// oldest beyond the `reported_requests` it says it holds. Their finish
    /// was lost (a caller that never reported it). Returns their ids.
    pub fn retire_unreported(
        &mut self,
        worker: WorkerId,
        reported_requests: u64,
        horizon_ms: u64,
    ) -> Vec<String> {
        let Some(queue) = self.decode_order.get_mut(&worker) else {
            return Vec::new();
        };
        let bookings = &self.bookings;
        let live = |at: u64, id: &String| {
            bookings
                .get(id)
                .is_some_and(|b| b.at_ms == at && b.decode_worker == worker)
        };
        while queue.front().is_some_and(|(at, id)| !live(*at, id)) {
            queue.pop_front();
        }
        let due: Vec<String> = queue
            .iter()
            .take_while(|(at, _)| *at < horizon_ms)
            .filter(|(at, id)| live(*at, id))
            .filter(|(_, id)| {
                let b = &bookings[id];
                !b.prefill_open || b.prefill_worker == b.decode_worker
            })
            .map(|(_, id)| id.clone())
            .collect();
        let excess = due.len().saturating_sub(reported_requests as usize);
        let retired: Vec<String> = due.into_iter().take(excess).collect();
        for id in &retired {
            self.release(id);
        }
        retired
    }

    /// The prefill finished: its tokens no longer queue on the prefill worker.
    /// Returns that worker and the tokens, or None for an unknown request or
    /// a repeated call.
    pub fn prefill_done(&mut self, request_id: &str) -> Option<(WorkerId, u64)> {
        let booking = self.bookings.get_mut(request_id)?;
        if !booking.prefill_open {
            return None;
        }
        close_prefill(&mut self.per_worker, booking);
        Some((booking.prefill_worker, booking.prefill_tokens))
    }

    /// The request finished or was cancelled: free everything it holds.
    pub fn release(&mut self, request_id: &str) -> Option<Booking> {
        let booking = self.bookings.remove(request_id)?;
        debit(&mut self.per_worker, &booking);
        if let Some(blocks) = self.blocks.remove(request_id) {
            self.active.remove(booking.decode_worker, &blocks);
        }
        Some(booking)
    }

    /// A peer replica booked a request (again: the new booking replaces it).
    pub fn charge_remote(&mut self, replica: &str, request_id: String, booking: Booking) {
        credit(&mut self.per_worker, &booking);
        let book = self.remote.entry_ref(replica).or_default();
        if let Some(old) = book.insert(request_id, booking) {
            debit(&mut self.per_worker, &old);
        }
    }

    /// A peer's request finished prefill; false when it is not booked here.
    pub fn prefill_done_remote(&mut self, replica: &str, request_id: &str) -> bool {
        let Some(booking) = self
            .remote
            .get_mut(replica)
            .and_then(|book| book.get_mut(request_id))
        else {
            return false;
        };
        if booking.prefill_open {
            close_prefill(&mut self.per_worker, booking);
        }
        true
    }

    /// A peer's request finished or was cancelled; false when not booked here.
    pub fn release_remote(&mut self, replica: &str, request_id: &str) -> bool {
        let Some(booking) = self
            .remote
            .get_mut(replica)
            .and_then(|book| book.remove(request_id))
        else {
            return false;
        };
        debit(&mut self.per_worker, &booking);
        true
    }

    /// A peer's whole book, which replaces what was known of it: this is
    /// how lost messages are repaired and a peer's expired bookings lapse.
    pub fn replace_remote(&mut self, replica: &str, bookings: Vec<(String, Booking)>) {
        self.drop_replica(replica);
        for (request_id, booking) in bookings {
            self.charge_remote(replica, request_id, booking);
        }
    }

    /// Forgets a peer replica's bookings; returns how many there were.
    pub fn drop_replica(&mut self, replica: &str) -> usize {
        let Some(book) = self.remote.remove(replica) else {
            return 0;
        };
        for booking in book.values() {
            debit(&mut self.per_worker, booking);
        }
        book.len()
    }

    /// Requests the peer replica has booked here.
    pub fn remote_len(&self, replica: &str) -> usize {
        self.remote.get(replica).map_or(0, HashMap::len)
    }

    pub fn contains_remote(&self, replica: &str, request_id: &str) -> bool {
        self.remote
            .get(replica)
            .is_some_and(|book| book.contains_key(request_id))
    }

    /// Drops bookings routed before `horizon_ms`: their finish report was
    /// lost, and counting them forever would starve the worker.
    pub fn expire(&mut self, horizon_ms: u64) -> usize {
        let mut expired = 0;
        while let Some((at, _)) = self.order.front() {
            if *at >= horizon_ms {
                break;
            }
            let (at, request_id) = self.order.pop_front().expect("front exists");
            if self
                .bookings
                .get(&request_id)
                .is_some_and(|b| b.at_ms == at)
            {
                self.release(&request_id);
                expired += 1;
            }
        }
        expired
    }

    /// Releases every booking that involves the worker; returns their ids.
    pub fn drop_worker(&mut self, worker: WorkerId) -> Vec<String> {
        let ids: Vec<String> = self
            .bookings
            .iter()
            .filter(|(_, b)| b.prefill_worker == worker || b.decode_worker == worker)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            self.release(id);
        }
        let per_worker = &mut self.per_worker;
        self.decode_order.remove(&worker);
        for book in self.remote.values_mut() {
            book.retain(|_, b| {
                let keep = b.prefill_worker != worker && b.decode_worker != worker;
                if !keep {
                    debit(per_worker, b);
                }
                keep
            });
        }
        self.per_worker.remove(&worker);
        ids
    }
}

fn credit(per_worker: &mut HashMap<WorkerId, Booked>, booking: &Booking) {
    if booking.prefill_open {
        per_worker
            .entry(booking.prefill_worker)
            .or_default()
            .prefill_tokens += booking.prefill_tokens;
    }
    let decode = per_worker.entry(booking.decode_worker).or_default();
    decode.decode_blocks += booking.decode_blocks;
    decode.requests += 1;
}

fn debit(per_worker: &mut HashMap<WorkerId, Booked>, booking: &Booking) {
    if booking.prefill_open {
        if let Some(w) = per_worker.get_mut(&booking.prefill_worker) {
            w.prefill_tokens -= booking.prefill_tokens;
        }
    }
    if let Some(w) = per_worker.get_mut(&booking.decode_worker) {
        w.decode_blocks -= booking.decode_blocks;
        w.requests -= 1;
    }
}

fn close_prefill(per_worker: &mut HashMap<WorkerId, Booked>, booking: &mut Booking) {
    booking.prefill_open = false;
    if let Some(w) = per_worker.get_mut(&booking.prefill_worker) {
        w.prefill_tokens -= booking.prefill_tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn booking(p: u64, d: u64, at_ms: u64) -> Booking {
        Booking {
            prefill_worker: WorkerId(p),
            decode_worker: WorkerId(d),
            prefill_tokens: 1000,
            decode_blocks: 20,
            prefill_open: true,
            at_ms,
        }
    }

    #[test]
    fn charge_prefill_done_release() {
        let mut book = LoadBook::default();
        book.charge("a".into(), booking(1, 2, 0), &[]);
        assert_eq!(book.booked(WorkerId(1)).prefill_tokens, 1000);
        assert_eq!(
            book.booked(WorkerId(2)),
            Booked {
                prefill_tokens: 0,
                decode_blocks: 20,
                requests: 1
            }
        );
        assert!(book.prefill_done("a").is_some());
        assert!(book.prefill_done("a").is_none());
        assert_eq!(book.booked(WorkerId(1)).prefill_tokens, 0);
        assert!(book.release("a").is_some());
        assert!(book.release("a").is_none());
        assert_eq!(book.booked(WorkerId(2)), Booked::default());
    }

    #[test]
    fn release_before_prefill_done_frees_the_prefill_tokens() {
        let mut book = LoadBook::default();
        book.charge("a".into(), booking(3, 3, 0), &[]);
        book.release("a");
        assert_eq!(book.booked(WorkerId(3)), Booked::default());
    }

    #[test]
    fn stale_bookings_expire_in_order() {
        let mut book = LoadBook::default();
        book.charge("old".into(), booking(1, 1, 10), &[]);
        book.charge("done".into(), booking(1, 1, 20), &[]);
        book.charge("new".into(), booking(1, 1, 30), &[]);
        book.release("done");
        assert_eq!(book.expire(25), 1);
        assert!(!book.contains("old") && book.contains("new"));
        assert_eq!(book.booked(WorkerId(1)).requests, 1);
    }

    #[test]
    fn the_expiry_queue_follows_the_requests_in_flight() {
        let mut book = LoadBook::default();
        book.charge("kept".into(), booking(1, 1, 0), &[]);
        for n in 0..100_000 {
            let id = format!("r{n}");
            book.charge(id.clone(), booking(1, 1, n), &[]);
            book.release(&id);
        }
        assert!(
            book.order.len() <= 2 + ORDER_SLACK + 1,
            "{}",
            book.order.len()
        );
        assert_eq!(book.expire(1), 1, "the live booking still expires");
        assert!(book.is_empty());
    }

    #[test]
    fn bookings_the_worker_no_longer_reports_are_retired_oldest_first() {
        let mut book = LoadBook::default();
        // Charged in routing order, as the router does.
        book.charge("old".into(), booking(1, 1, 0), &[]);
        book.charge("older-done".into(), booking(1, 1, 5), &[]);
        book.charge("split".into(), booking(2, 1, 6), &[]);
        book.charge("recent".into(), booking(1, 1, 100), &[]);
        book.release("older-done");
        // Routed before 50: "old" (due) and "split" (its prefill still open).
        assert_eq!(
            book.retire_unreported(WorkerId(1), 1, 50),
            Vec::<String>::new()
        );
        assert_eq!(
            book.retire_unreported(WorkerId(1), 0, 50),
            vec!["old".to_string()]
        );
        book.prefill_done("split");
        assert_eq!(
            book.retire_unreported(WorkerId(1), 0, 50),
            vec!["split".to_string()]
        );
        assert!(book.contains("recent"));
        assert_eq!(book.booked(WorkerId(1)).requests, 1);
        assert_eq!(
            book.retire_unreported(WorkerId(9), 0, 50),
            Vec::<String>::new()
        );
    }

    #[test]
    fn peer_bookings_count_until_the_peer_releases_or_goes() {
        let mut book = LoadBook::default();
        book.charge("a".into(), booking(1, 1, 0), &[]);
        book.charge_remote("peer", "a".into(), booking(1, 2, 0));
        book.charge_remote("peer", "b".into(), booking(2, 2, 0));
        assert_eq!(book.booked(WorkerId(1)).prefill_tokens, 2000);
        assert_eq!(book.booked(WorkerId(2)).requests, 2);
        assert!(book.prefill_done_remote("peer", "a"));
        assert_eq!(book.booked(WorkerId(1)).prefill_tokens, 1000);
        assert!(book.release_remote("peer", "a"));
        assert!(!book.release_remote("peer", "a"));
        assert!(
            book.contains("a"),
            "a peer's release leaves the own booking"
        );
        assert!(book.contains_remote("peer", "b") && !book.contains_remote("peer", "a"));
        book.replace_remote("peer", vec![("c".into(), booking(3, 3, 0))]);
        assert_eq!(book.booked(WorkerId(2)), Booked::default());
        assert_eq!(book.booked(WorkerId(3)).requests, 1);
        assert_eq!(book.drop_replica("peer"), 1);
        assert_eq!(book.booked(WorkerId(3)), Booked::default());
        assert_eq!(book.remote_len("peer"), 0);
    }

    #[test]
    fn a_prefix_shared_by_active_requests_counts_once_until_the_last_leaves() {
        let mut book = LoadBook::default();
        let prompt = |tail: u64| -> Vec<SeqHash> {
            (0..15)
                .chain(std::iter::once(100 + tail))
                .map(SeqHash)
                .collect()
        };
        let hashed = |d: u64, at_ms: u64| Booking {
            decode_blocks: 16,
            ..booking(d, d, at_ms)
        };
        for n in 0..4 {
            book.charge(format!("r{n}"), hashed(1, n), &prompt(n));
        }
        book.charge("unhashed".into(), booking(1, 1, 9), &[]);
        book.charge_remote("peer", "p".into(), booking(1, 1, 0));
        let w = WorkerId(1);
        assert_eq!(book.booked(w).decode_blocks, 4 * 16 + 20 + 20);
        assert_eq!(book.active_blocks(w), 15 + 4 + 20 + 20);
        assert_eq!(book.active_shared(w, &prompt(7)), 15);
        assert_eq!(book.active_shared(WorkerId(2), &prompt(7)), 0);
        book.release("r0");
        assert_eq!(book.expire(2), 1, "r1 expires");
        assert_eq!(book.active_blocks(w), 15 + 2 + 20 + 20);
        book.release("r2");
        assert_eq!(book.drop_worker(w).len(), 2);
        assert_eq!(book.active_blocks(w), 0);
        assert_eq!(book.active_shared(w, &prompt(3)), 0);
    }

    #[test]
    fn dropping_a_worker_releases_its_requests() {
        let mut book = LoadBook::default();
        book.charge("a".into(), booking(1, 2, 0), &[]);
        book.charge("b".into(), booking(3, 3, 0), &[]);
        assert_eq!(book.drop_worker(WorkerId(2)), vec!["a".to_string()]);
        assert_eq!(book.booked(WorkerId(1)), Booked::default());
        assert_eq!(book.len(), 1);
    }
}

//! Session affinity: the workers each session was last routed to, so that
//! among equally good candidates a session's next request goes where its
//! last one went (its first turns, before the index holds any of it).
//!
//! Design: a session is kept by the xxh3 hash of its id, so an entry costs
//! the same whatever the id, and a collision (about 1 in 2^33 at the cap)
//! only breaks one tie differently. The map is two generations of at most
//! `MAX_SESSIONS / 2` entries each: when the newer fills, the older is
//! dropped and the newer takes its place, and a session routed again moves
//! to the newer. So at most `MAX_SESSIONS` are held, and at least the
//! `MAX_SESSIONS / 2` most recently routed ones, whatever ids arrive, in
//! O(1) per decision. The remembered worker only ever breaks a tie
//! (`Selector::pick`); a removed worker's sessions are forgotten
//! (`Pool::remove_worker`).

use crate::ids::WorkerId;
use hashbrown::HashMap;
use xxhash_rust::xxh3::xxh3_64;

/// Sessions remembered at most.
pub const MAX_SESSIONS: usize = 65_536;

/// A session id as the router keeps it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey(u64);

impl SessionKey {
    /// None for the empty id: no session.
    pub fn of(session: &str) -> Option<SessionKey> {
        (!session.is_empty()).then(|| SessionKey(xxh3_64(session.as_bytes())))
    }
}

/// Where a session's last request went.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Affinity {
    pub decode: WorkerId,
    /// None: the decode worker prefilled it.
    pub prefill: Option<WorkerId>,
}

#[derive(Debug, Default)]
pub struct Sessions {
    newer: HashMap<SessionKey, Affinity>,
    older: HashMap<SessionKey, Affinity>,
}

impl Sessions {
    pub fn get(&self, session: SessionKey) -> Option<Affinity> {
        self.newer
            .get(&session)
            .or_else(|| self.older.get(&session))
            .copied()
    }

    pub fn remember(&mut self, session: SessionKey, affinity: Affinity) {
        self.older.remove(&session);
        if self.newer.len() >= MAX_SESSIONS / 2 && !self.newer.contains_key(&session) {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(session, affinity);
    }

    /// Forgets every session last routed to `worker`.
    pub fn forget_worker(&mut self, worker: WorkerId) {
        let keep =
            |_: &SessionKey, a: &mut Affinity| a.decode != worker && a.prefill != Some(worker);
        self.newer.retain(keep);
        self.older.retain(keep);
    }

    pub fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(worker: u64) -> Affinity {
        Affinity {
            decode: WorkerId(worker),
            prefill: None,
        }
    }

    #[test]
    fn the_empty_id_is_no_session() {
        assert_eq!(SessionKey::of(""), None);
        assert_eq!(SessionKey::of("a"), SessionKey::of("a"));
        assert_ne!(SessionKey::of("a"), SessionKey::of("b"));
    }

    #[test]
    fn stays_bounded_and_keeps_the_recent_half() {
        let mut sessions = Sessions::default();
        let key = |n: usize| SessionKey::of(&format!("garbage-{n}")).unwrap();
        let total = 3 * MAX_SESSIONS + 17;
        for n in 0..total {
            sessions.remember(key(n), at(n as u64 % 4));
            assert!(sessions.len() <= MAX_SESSIONS);
        }
        for n in total - MAX_SESSIONS / 2..total {
            assert_eq!(sessions.get(key(n)), Some(at(n as u64 % 4)));
        }
        assert_eq!(sessions.get(key(0)), None);
    }

    #[test]
    fn a_session_routed_again_survives_the_turnover() {
        let mut sessions = Sessions::default();
        let kept = SessionKey::of("kept").unwrap();
        sessions.remember(kept, at(1));
        for n in 0..2 * MAX_SESSIONS {
            if n % (MAX_SESSIONS / 4) == 0 {
                sessions.remember(kept, at(2));
            }
            sessions.remember(SessionKey::of(&n.to_string()).unwrap(), at(0));
        }
        assert_eq!(sessions.get(kept), Some(at(2)));
    }

    #[test]
    fn a_removed_worker_pins_nothing() {
        let mut sessions = Sessions::default();
        let (a, b, c) = (
            SessionKey::of("a").unwrap(),
            SessionKey::of("b").unwrap(),
            SessionKey::of("c").unwrap(),
        );
        sessions.remember(a, at(1));
        sessions.remember(
            b,
            Affinity {
                decode: WorkerId(2),
                prefill: Some(WorkerId(1)),
            },
        );
        sessions.remember(c, at(2));
        sessions.forget_worker(WorkerId(1));
        assert_eq!((sessions.get(a), sessions.get(b)), (None, None));
        assert_eq!(sessions.get(c), Some(at(2)));
    }
}

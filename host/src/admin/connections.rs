//! Who holds the admin listener's connections: at most `admin.max.connections` at once and
//! a quarter of them (at least 8) per peer address. When a cap is reached, the oldest idle
//! connection (one that has not sent a whole request yet, or has none in flight for a
//! second) is closed to make room — of that peer, or of the peer holding the most — so a
//! flood of idle sockets never keeps a health check or a caller out; a connection is
//! refused only when every one that could make room is busy.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long a connection that served a request must have had none in flight before it
/// may be closed for another (its answer may still be on its way out).
const KEEP_ALIVE_GRACE: Duration = Duration::from_secs(1);

/// The connections open now.
pub(super) struct Connections {
    max_total: usize,
    max_per_peer: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// By id: the oldest first.
    open: BTreeMap<u64, Arc<Connection>>,
    per_peer: HashMap<IpAddr, usize>,
}

/// One open connection.
pub(super) struct Connection {
    id: u64,
    peer: IpAddr,
    /// Requests in flight.
    busy: AtomicUsize,
    /// When its last request ended (none: it has not sent one yet).
    idle_since: Mutex<Option<Instant>>,
    /// Told when it is closed to make room for another.
    shed: Notify,
}

impl Connection {
    /// Marks a request in flight until the guard is dropped.
    pub(super) fn request(self: &Arc<Self>) -> RequestGuard {
        self.busy.fetch_add(1, Ordering::SeqCst);
        RequestGuard(self.clone())
    }

    /// Completes when the connection is closed to make room.
    pub(super) async fn shed(&self) {
        self.shed.notified().await
    }

    fn sheddable(&self, now: Instant) -> bool {
        self.busy.load(Ordering::SeqCst) == 0
            && self
                .idle_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_none_or(|t| now.duration_since(t) >= KEEP_ALIVE_GRACE)
    }
}

/// A request in flight on a connection.
pub(super) struct RequestGuard(Arc<Connection>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection admitted: it leaves the table when dropped.
pub(super) struct Admitted {
    pub(super) connection: Arc<Connection>,
    table: Arc<Connections>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.table.lock().remove(self.connection.id);
    }
}

impl Inner {
    fn remove(&mut self, id: u64) -> Option<Arc<Connection>> {
        let gone = self.open.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&gone.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&gone.peer);
            }
        }
        Some(gone)
    }

    /// Closes the oldest idle connection of `peer` (none: of the peer holding the most
    /// connections that has an idle one); false when none is idle.
    fn shed_one(&mut self, peer: Option<IpAddr>, now: Instant) -> bool {
        let candidates = self
            .open
            .values()
            .filter(|c| peer.is_none_or(|p| c.peer == p) && c.sheddable(now));
        // The peer holding the most first; of its connections, the oldest (least id).
        let victim = candidates
            .max_by_key(|c| {
                (
                    self.per_peer.get(&c.peer).copied().unwrap_or(0),
                    std::cmp::Reverse(c.id),
                )
            })
            .map(|c| c.id);
        let Some(gone) = victim.and_then(|id| self.remove(id)) else {
            return false;
        };
        gone.shed.notify_one();
        true
    }
}

impl Connections {
    pub(super) fn new(max_total: usize) -> Arc<Connections> {
        let max_total = max_total.max(1);
        Arc::new(Connections {
            max_total,
            max_per_peer: (max_total / 4).max(8).min(max_total),
            inner: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `peer`, closing an idle one to make room when a cap is
    /// reached; none when every connection that could make room is busy.
    pub(super) fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Admitted> {
        let now = Instant::now();
        let mut inner = self.lock();
        if inner.per_peer.get(&peer).copied().unwrap_or(0) >= self.max_per_peer && !inner.shed_one(Some(peer), now) {
            return None;
        }
        if inner.open.len() >= self.max_total && !inner.shed_one(None, now) {
            return None;
        }
        inner.next_id += 1;
        let connection = Arc::new(Connection {
            id: inner.next_id,
            peer,
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(None),
            shed: Notify::new(),
        });
        inner.open.insert(connection.id, connection.clone());
        *inner.per_peer.entry(peer).or_default() += 1;
        drop(inner);
        Some(Admitted {
            connection,
            table: self.clone(),
        })
    }

    #[cfg(test)]
    fn open(&self, peer: IpAddr) -> usize {
        self.lock().per_peer.get(&peer).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_flood_of_idle_connections_from_one_peer_makes_room_for_a_new_one() {
        let table = Connections::new(256);
        let flood: Vec<Admitted> = (0..300).map(|_| table.admit(ip(1)).expect("room is made")).collect();
        assert_eq!(table.open(ip(1)), 64, "a peer holds a quarter of the connections");
        // The oldest were closed, and told so.
        let closed = flood
            .iter()
            .take_while(|a| !table.lock().open.contains_key(&a.connection.id));
        assert_eq!(closed.count(), 300 - 64);
        assert!(table.admit(ip(1)).is_some());
        assert!(table.admit(ip(2)).is_some(), "another peer is not refused");
    }

    #[test]
    fn busy_connections_are_never_closed_and_a_full_table_refuses() {
        let table = Connections::new(16);
        let held: Vec<Admitted> = (0..8).map(|_| table.admit(ip(1)).unwrap()).collect();
        let _requests: Vec<RequestGuard> = held.iter().map(|a| a.connection.request()).collect();
        assert!(table.admit(ip(1)).is_none(), "every connection of the peer is busy");
        let others: Vec<Admitted> = (2..10).map(|i| table.admit(ip(i)).unwrap()).collect();
        let _busy: Vec<RequestGuard> = others.iter().map(|a| a.connection.request()).collect();
        assert!(table.admit(ip(20)).is_none(), "every connection is busy");
        drop(_busy);
        // Just finished: still in its grace.
        assert!(table.admit(ip(20)).is_none());
        for a in &others {
            *a.connection.idle_since.lock().unwrap() = Some(Instant::now() - KEEP_ALIVE_GRACE);
        }
        assert!(
            table.admit(ip(20)).is_some(),
            "an idle keep-alive connection makes room"
        );
    }

    #[test]
    fn the_peer_holding_the_most_gives_way_when_the_table_is_full() {
        let table = Connections::new(16);
        let _a: Vec<Admitted> = (0..8).map(|_| table.admit(ip(1)).unwrap()).collect();
        let _b: Vec<Admitted> = (0..4).map(|_| table.admit(ip(2)).unwrap()).collect();
        let _c: Vec<Admitted> = (0..4).map(|_| table.admit(ip(3)).unwrap()).collect();
        let _d = table.admit(ip(4)).unwrap();
        assert_eq!((table.open(ip(1)), table.open(ip(2)), table.open(ip(3))), (7, 4, 4));
    }

    #[test]
    fn a_closed_connection_leaves_the_table() {
        let table = Connections::new(16);
        let a = table.admit(ip(1)).unwrap();
        drop(a);
        assert_eq!(table.open(ip(1)), 0);
        assert!(table.lock().open.is_empty());
    }
}

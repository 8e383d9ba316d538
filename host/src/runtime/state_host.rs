//! The host side of `sluice:topology/state`: stores a task declared, opened by name, and
//! scans read page by page. The stores themselves are [`StateStore`]s the worker provides.

use wasmtime::component::Resource;

use super::bindings::sluice::topology0_1_0::state::{self as wit, Entry, StateError};
use super::fault::GuestFault;
use super::host::{TaskData, MAX_RESOURCES};
use crate::state::{prefix_end, StateStore};

/// A store the guest opened: an index into the task's stores.
pub struct StoreHandle {
    index: usize,
}

/// A scan in progress: its bounds and the last key it returned.
pub struct ScanState {
    store: usize,
    start: Option<Vec<u8>>,
    end: Option<Vec<u8>>,
    last: Option<Vec<u8>>,
    done: bool,
}

/// One of a task's stores, by the name the topology declared.
pub struct NamedStore {
    pub name: String,
    pub store: Box<dyn StateStore>,
}

/// Most entries one page may hold, whatever the guest asks for (a guest-controlled size).
const MAX_PAGE: u32 = 10_000;

fn storage(e: String) -> StateError {
    StateError::Storage(e)
}

/// Most bytes of entries one page holds (at least one entry), whatever the guest asks for.
const MAX_PAGE_BYTES: usize = 4 << 20;

type Answer<T> = wasmtime::Result<Result<T, StateError>>;

impl TaskData {
    fn store_at(&mut self, handle: &Resource<StoreHandle>) -> Result<&mut Box<dyn StateStore>, StateError> {
        let index = self.table.get(handle).map_err(|e| storage(e.to_string()))?.index;
        Ok(&mut self.stores[index].store)
    }

    /// Keeps a new handle, or ends the call when the guest holds too many.
    fn push<T: Send + 'static>(&mut self, value: T, what: &'static str) -> wasmtime::Result<Resource<T>> {
        match self.table.push(value) {
            Ok(handle) => Ok(handle),
            Err(_) => Err(self.deny(GuestFault::Budget {
                budget: "open resources",
                unit: "handles",
                limit: MAX_RESOURCES,
                wanted: MAX_RESOURCES + 1,
                what,
            })),
        }
    }

    /// A write of `bytes` more, within the host-memory budget.
    fn charge_write(&mut self, bytes: usize) -> wasmtime::Result<()> {
        self.charge("state writes not yet committed", bytes)
    }
}

impl wit::Host for TaskData {}

impl wit::HostStore for TaskData {
    fn open(&mut self, name: String) -> Answer<Resource<StoreHandle>> {
        let Some(index) = self.stores.iter().position(|s| s.name == name) else {
            let declared: Vec<String> = self.stores.iter().map(|s| format!("{:?}", s.name)).collect();
            let declared = if declared.is_empty() {
                "none".to_string()
            } else {
                declared.join(", ")
            };
            self.undeclared
                .get_or_insert_with(|| format!("the store {name:?} (declared stores: {declared})"));
            return Ok(Err(StateError::Undeclared(format!(
                "not declared by the topology, so it cannot be opened (declared stores: {declared})"
            ))));
        };
        Ok(Ok(self.push(StoreHandle { index }, "an open store")?))
    }

    fn get(&mut self, store: Resource<StoreHandle>, key: Vec<u8>) -> Answer<Option<Vec<u8>>> {
        Ok(self.store_at(&store).and_then(|s| s.get(&key).map_err(storage)))
    }

    fn put(&mut self, store: Resource<StoreHandle>, key: Vec<u8>, value: Vec<u8>) -> Answer<()> {
        self.charge_write(key.len() + value.len())?;
        Ok(self.store_at(&store).and_then(|s| s.put(key, value).map_err(storage)))
    }

    fn delete(&mut self, store: Resource<StoreHandle>, key: Vec<u8>) -> Answer<()> {
        self.charge_write(key.len())?;
        Ok(self.store_at(&store).and_then(|s| s.delete(key).map_err(storage)))
    }

    fn write_batch(&mut self, store: Resource<StoreHandle>, entries: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Answer<()> {
        let bytes = entries
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        self.charge_write(bytes)?;
        let s = match self.store_at(&store) {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        for (key, value) in entries {
            let written = match value {
                Some(v) => s.put(key, v),
                None => s.delete(key),
            };
            if let Err(e) = written {
                return Ok(Err(storage(e)));
            }
        }
        Ok(Ok(()))
    }

    fn range(
        &mut self,
        store: Resource<StoreHandle>,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
    ) -> Answer<Resource<ScanState>> {
        let index = match self.table.get(&store) {
            Ok(handle) => handle.index,
            Err(e) => return Ok(Err(storage(e.to_string()))),
        };
        let scan = ScanState {
            store: index,
            start,
            end,
            last: None,
            done: false,
        };
        Ok(Ok(self.push(scan, "an open scan")?))
    }

    fn prefix(&mut self, store: Resource<StoreHandle>, prefix: Vec<u8>) -> Answer<Resource<ScanState>> {
        let end = prefix_end(&prefix);
        let start = if prefix.is_empty() { None } else { Some(prefix) };
        self.range(store, start, end)
    }

    fn drop(&mut self, store: Resource<StoreHandle>) -> wasmtime::Result<()> {
        self.table.delete(store)?;
        Ok(())
    }
}

impl wit::HostScan for TaskData {
    fn next_page(&mut self, scan: Resource<ScanState>, max: u32) -> Answer<Vec<Entry>> {
        let state = match self.table.get(&scan) {
            Ok(state) => state,
            Err(e) => return Ok(Err(storage(e.to_string()))),
        };
        if state.done {
            return Ok(Ok(Vec::new()));
        }
        let (index, start, end, last) = (state.store, state.start.clone(), state.end.clone(), state.last.clone());
        let max = max.clamp(1, MAX_PAGE) as usize;
        // The page stops at its byte budget before the store copies the entry past it.
        let page =
            match self.stores[index]
                .store
                .scan(start.as_deref(), end.as_deref(), last.as_deref(), max, MAX_PAGE_BYTES)
            {
                Ok(page) => page,
                Err(e) => return Ok(Err(storage(e))),
            };
        let state = match self.table.get_mut(&scan) {
            Ok(state) => state,
            Err(e) => return Ok(Err(storage(e.to_string()))),
        };
        // A page cut by count or by bytes may have more after it: the scan is over when a
        // page comes back empty.
        state.done = page.is_empty();
        if let Some((k, _)) = page.last() {
            state.last = Some(k.clone());
        }
        Ok(Ok(page.into_iter().map(|(key, value)| Entry { key, value }).collect()))
    }

    fn drop(&mut self, scan: Resource<ScanState>) -> wasmtime::Result<()> {
        self.table.delete(scan)?;
        Ok(())
    }
}

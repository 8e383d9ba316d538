//! The host side of `sluice:topology/state`: stores a task declared, opened by name, and
//! scans read page by page. The stores themselves are [`StateStore`]s the worker provides.

use wasmtime::component::Resource;

use super::bindings::sluice::topology::state::{self as wit, Entry, StateError};
use super::host::TaskData;
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

impl TaskData {
    fn store_at(&mut self, handle: &Resource<StoreHandle>) -> Result<&mut Box<dyn StateStore>, StateError> {
        let index = self.table.get(handle).map_err(|e| storage(e.to_string()))?.index;
        Ok(&mut self.stores[index].store)
    }
}

impl wit::Host for TaskData {}

impl wit::HostStore for TaskData {
    fn open(&mut self, name: String) -> Result<Resource<StoreHandle>, StateError> {
        let Some(index) = self.stores.iter().position(|s| s.name == name) else {
            let declared: Vec<String> = self.stores.iter().map(|s| format!("{:?}", s.name)).collect();
            let declared = if declared.is_empty() {
                "none".to_string()
            } else {
                declared.join(", ")
            };
            return Err(StateError::Undeclared(format!(
                "not declared by the topology, so it cannot be opened (declared stores: {declared})"
            )));
        };
        self.table
            .push(StoreHandle { index })
            .map_err(|e| storage(e.to_string()))
    }

    fn get(&mut self, store: Resource<StoreHandle>, key: Vec<u8>) -> Result<Option<Vec<u8>>, StateError> {
        self.store_at(&store)?.get(&key).map_err(storage)
    }

    fn put(&mut self, store: Resource<StoreHandle>, key: Vec<u8>, value: Vec<u8>) -> Result<(), StateError> {
        self.store_at(&store)?.put(key, value).map_err(storage)
    }

    fn delete(&mut self, store: Resource<StoreHandle>, key: Vec<u8>) -> Result<(), StateError> {
        self.store_at(&store)?.delete(key).map_err(storage)
    }

    fn write_batch(
        &mut self,
        store: Resource<StoreHandle>,
        entries: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<(), StateError> {
        let s = self.store_at(&store)?;
        for (key, value) in entries {
            match value {
                Some(v) => s.put(key, v),
                None => s.delete(key),
            }
            .map_err(storage)?;
        }
        Ok(())
    }

    fn range(
        &mut self,
        store: Resource<StoreHandle>,
        start: Option<Vec<u8>>,
        end: Option<Vec<u8>>,
    ) -> Result<Resource<ScanState>, StateError> {
        let index = self.table.get(&store).map_err(|e| storage(e.to_string()))?.index;
        let scan = ScanState {
            store: index,
            start,
            end,
            last: None,
            done: false,
        };
        self.table.push(scan).map_err(|e| storage(e.to_string()))
    }

    fn prefix(&mut self, store: Resource<StoreHandle>, prefix: Vec<u8>) -> Result<Resource<ScanState>, StateError> {
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
    fn next_page(&mut self, scan: Resource<ScanState>, max: u32) -> Result<Vec<Entry>, StateError> {
        let state = self.table.get(&scan).map_err(|e| storage(e.to_string()))?;
        if state.done {
            return Ok(Vec::new());
        }
        let (index, start, end, last) = (state.store, state.start.clone(), state.end.clone(), state.last.clone());
        let max = max.clamp(1, MAX_PAGE) as usize;
        let page = self.stores[index]
            .store
            .scan(start.as_deref(), end.as_deref(), last.as_deref(), max)
            .map_err(storage)?;
        let state = self.table.get_mut(&scan).map_err(|e| storage(e.to_string()))?;
        state.done = page.len() < max;
        if let Some((k, _)) = page.last() {
            state.last = Some(k.clone());
        }
        Ok(page.into_iter().map(|(key, value)| Entry { key, value }).collect())
    }

    fn drop(&mut self, scan: Resource<ScanState>) -> wasmtime::Result<()> {
        self.table.delete(scan)?;
        Ok(())
    }
}

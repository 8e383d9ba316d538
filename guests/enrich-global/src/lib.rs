//! Example topology: orders enriched with their customer, the customers a *global table*.
//!
//! The host copies every partition of the topic bound to `customers` into the store
//! `customers` (the latest value per key; a record without a value deletes its key), once
//! per worker, and keeps it current; every task reads it. So, unlike `enrich`, the two
//! topics need not be co-partitioned: an order is keyed by its own id and names its customer
//! in its value, `"<customer id>|<order>"`, and any task finds any customer.
//!
//! Each order goes to `enriched`, keyed by the order's key: `"<order> | <customer>"`, or
//! `"<order> | unknown customer"` (a left join). The host refuses writes to a global table.

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, TaskInfo};

struct EnrichGlobal {
    customers: Store<Vec<u8>, Vec<u8>>,
}

impl Processor for EnrichGlobal {
    fn describe() -> Description {
        Description::new("enrich-global")
            .source("orders")
            .sink("enriched")
            .global_store("customers", "customers")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(EnrichGlobal {
            customers: Store::open("customers")?,
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let value = record.value().unwrap_or_default();
        let value = std::str::from_utf8(value).map_err(|_| Error::msg("an order that is not UTF-8"))?;
        let Some((customer, order)) = value.split_once('|') else {
            return Err(Error::msg(format!(
                "order at offset {} is {value:?}, not \"<customer id>|<order>\"",
                record.offset()
            )));
        };
        let found = self.customers.get(&customer.as_bytes().to_vec())?;
        let name = match &found {
            Some(bytes) => std::str::from_utf8(bytes).map_err(|_| Error::msg("a customer that is not UTF-8"))?,
            None => "unknown customer",
        };
        let key = record.key().map(<[u8]>::to_vec);
        ctx.emit("enriched", key.as_ref(), &format!("{order} | {name}"))
    }
}

export!(EnrichGlobal);

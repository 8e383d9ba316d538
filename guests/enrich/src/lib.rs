//! Example topology: a stream-table join. `customers` (keyed by customer id, a table: the
//! latest value per key wins, an empty value deletes it) is kept in the store `customers`;
//! each record of `orders` (keyed by the same customer id) goes to `enriched` with its
//! customer: `"<order> | <customer>"`, or `"<order> | unknown customer"` when the table has
//! no such customer yet (a left join).
//!
//! A task reads the same partition of both sources, so the join is right only when the two
//! topics are co-partitioned: the same partition count, and keys put where the same
//! partitioner puts them. Sluice refuses sources of different partition counts; writing both
//! with Java's default partitioner (as Sluice's outputs and Kafka Streams do) does the rest.

use sluice_guest::{export, Context, Description, Error, Processor, Record, Store, TaskInfo};

struct Enrich {
    customers: Store<Vec<u8>, Vec<u8>>,
}

impl Processor for Enrich {
    fn describe() -> Description {
        Description::new("enrich")
            .source("orders")
            .source("customers")
            .sink("enriched")
            .store("customers")
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(Enrich {
            customers: Store::open("customers")?,
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        let Some(key) = record.key() else {
            return Err(Error::msg(format!(
                "a {} record without a key (offset {}): both sources are keyed by customer id",
                record.source(),
                record.offset()
            )));
        };
        let key = key.to_vec();
        let value = record.value().unwrap_or_default();
        if record.source() == "customers" {
            if value.is_empty() {
                self.customers.delete(&key)?;
            } else {
                self.customers.put(&key, &value.to_vec())?;
            }
            return Ok(());
        }
        let order = std::str::from_utf8(value).map_err(|_| Error::msg("an order that is not UTF-8"))?;
        let customer = self.customers.get(&key)?;
        let customer = match &customer {
            Some(bytes) => std::str::from_utf8(bytes).map_err(|_| Error::msg("a customer that is not UTF-8"))?,
            None => "unknown customer",
        };
        ctx.emit("enriched", Some(&key), &format!("{order} | {customer}"))
    }
}

export!(Enrich);

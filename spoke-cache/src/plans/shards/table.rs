//! The shards the plans name, each once: its name and size, and how many plans name it.
//! Plans refer to a shard by its id here, so a shard named by sixteen plans of two epochs
//! each is one name in memory, not thirty-two.

use std::collections::HashMap;

use crate::store::entry::ShardKey;

#[derive(Debug)]
struct Slot {
    key: ShardKey,
    size: u64,
    /// Plans that name it.
    plans: u32,
}

/// Shards by id, and ids by shard.
#[derive(Debug, Default)]
pub(super) struct ShardTable {
    ids: HashMap<ShardKey, u32>,
    slots: Vec<Option<Slot>>,
    /// Ids no shard has now, taken again first.
    free: Vec<u32>,
}

impl ShardTable {
    /// The id of `key` for one more plan (of `size` bytes: the latest plan's word).
    pub(super) fn intern(&mut self, key: ShardKey, size: u64) -> u32 {
        if let Some(&id) = self.ids.get(&key) {
            if let Some(slot) = self.slots[id as usize].as_mut() {
                slot.plans += 1;
                slot.size = size;
            }
            return id;
        }
        let id = self.free.pop().unwrap_or(self.slots.len() as u32);
        let slot = Some(Slot { key: key.clone(), size, plans: 1 });
        match self.slots.get_mut(id as usize) {
            Some(free) => *free = slot,
            None => self.slots.push(slot),
        }
        self.ids.insert(key, id);
        id
    }

    /// One plan fewer names shard `id`; it leaves when none does.
    pub(super) fn release(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize).and_then(Option::as_mut) else { return };
        slot.plans -= 1;
        if slot.plans == 0
            && let Some(slot) = self.slots[id as usize].take()
        {
            self.ids.remove(&slot.key);
            self.free.push(id);
        }
    }

    pub(super) fn id(&self, key: &ShardKey) -> Option<u32> {
        self.ids.get(key).copied()
    }

    pub(super) fn key(&self, id: u32) -> Option<&ShardKey> {
        self.slots.get(id as usize)?.as_ref().map(|s| &s.key)
    }

    pub(super) fn size(&self, id: u32) -> u64 {
        self.slots.get(id as usize).and_then(Option::as_ref).map_or(0, |s| s.size)
    }

    /// One past the highest id in use.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_named_by_several_plans_is_kept_once_until_the_last_lets_go() {
        let mut table = ShardTable::default();
        let key = ("ds".to_owned(), "s0".to_owned());
        let a = table.intern(key.clone(), 10);
        assert_eq!(table.intern(key.clone(), 12), a, "one id");
        assert_eq!(table.size(a), 12);
        table.release(a);
        assert_eq!(table.id(&key), Some(a), "one plan still names it");
        table.release(a);
        assert_eq!((table.id(&key), table.key(a)), (None, None));
        let b = table.intern(("ds".into(), "s1".into()), 1);
        assert_eq!(b, a, "its id is taken again");
    }
}

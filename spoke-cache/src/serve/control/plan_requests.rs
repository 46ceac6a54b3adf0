//! The plans a `SetPlan` or `PlanSamples` request carries, checked and turned into the
//! spoke's forms: positions naming a table of shards, and sample reads naming theirs.

use std::collections::HashMap;

use shardcache_proto::{
    names::{DatasetName, ShardName},
    v1::{PlanRequest, SamplePlanRequest},
};
use tonic::Status;

use crate::{
    plans::samples::{MAX_PLANNED_PER_JOB, PlannedRead},
    plans::shards::NewPlan,
};

/// A plan request's shards (each once) and positions: from its table and each position's
/// index in it (the SDK's form), or from each position's names; `until`s checked.
pub(super) fn plan_positions(
    req: &PlanRequest,
    positions: usize,
) -> Result<(Vec<(DatasetName, ShardName)>, NewPlan), Status> {
    let mut table: Vec<(DatasetName, ShardName)> = Vec::new();
    let mut index: HashMap<(&str, &str), u32> = HashMap::new();
    for shard in &req.shard_table {
        table.push((DatasetName::new(&shard.dataset)?, ShardName::new(&shard.shard)?));
    }
    let mut plan = NewPlan { positions: Vec::with_capacity(positions), ..NewPlan::default() };
    for (number, epoch) in req.epochs.iter().enumerate() {
        let epoch_number = req.epoch + number as u64;
        let count = if req.shard_table.is_empty() { epoch.shards.len() } else { epoch.shard_index.len() };
        if !epoch.until.is_empty() && epoch.until.len() != count {
            return Err(Status::invalid_argument(format!(
                "epoch {epoch_number} of the plan has {count} shards but {} `until` entries; send one per shard or none",
                epoch.until.len()
            )));
        }
        let offset = plan.positions.len();
        plan.epochs.push((offset as u32, epoch_number));
        for i in 0..count {
            let local = if req.shard_table.is_empty() {
                let shard = &epoch.shards[i];
                match index.get(&(shard.dataset.as_str(), shard.shard.as_str())) {
                    Some(&local) => local,
                    None => {
                        table.push((DatasetName::new(&shard.dataset)?, ShardName::new(&shard.shard)?));
                        index.insert((shard.dataset.as_str(), shard.shard.as_str()), table.len() as u32 - 1);
                        table.len() as u32 - 1
                    }
                }
            } else {
                let local = epoch.shard_index[i];
                if local as usize >= table.len() {
                    return Err(Status::invalid_argument(format!(
                        "position {i} of epoch {epoch_number} of the plan names shard {local} of a table of {}",
                        table.len()
                    )));
                }
                local
            };
            let until = epoch.until.get(i).map_or(i, |&u| u as usize);
            if until < i || until >= count {
                let (dataset, shard) = &table[local as usize];
                return Err(Status::invalid_argument(format!(
                    "`until` of shard {i} ({dataset}/{shard}) in epoch {epoch_number} of the plan is {until}: it must be \
                     from {i} to {}",
                    count - 1
                )));
            }
            plan.positions.push(local);
            plan.until.push((offset + until) as u32);
        }
    }
    Ok((table, plan))
}

/// A sample plan's shards (each once) and its reads, naming them by index.
pub(super) type PlannedSamples = (Vec<crate::store::entry::ShardKey>, Vec<PlannedRead>);

/// A sample plan request's shards and reads, checked: one entry per read in each list,
/// every shard named validly and in the table, every range non-empty, within `--max-read`
/// and not past the end of a shard that could exist.
pub(super) fn planned_samples(req: &SamplePlanRequest, max_read: u64) -> Result<PlannedSamples, Status> {
    let count = req.position.len();
    if [req.shard.len(), req.offset.len(), req.length.len(), req.next_use.len()].iter().any(|&n| n != count) {
        return Err(Status::invalid_argument(
            "a sample plan's position, shard, offset, length and next_use lists must have one entry per read each",
        ));
    }
    if count > MAX_PLANNED_PER_JOB {
        return Err(Status::invalid_argument(format!(
            "a sample plan of {count} reads is over the limit of {MAX_PLANNED_PER_JOB}; send the next few thousand \
             reads at a time"
        )));
    }
    let mut table = Vec::with_capacity(req.shard_table.len());
    for shard in &req.shard_table {
        table
            .push((DatasetName::new(&shard.dataset)?.to_string(), ShardName::new(&shard.shard)?.to_string()));
    }
    let mut reads = Vec::with_capacity(count);
    for i in 0..count {
        let (shard, offset, length) = (req.shard[i], req.offset[i], req.length[i]);
        if shard as usize >= table.len() {
            return Err(Status::invalid_argument(format!(
                "read {i} of the sample plan names shard {shard} of a table of {}",
                table.len()
            )));
        }
        if length == 0 || length > max_read || offset.checked_add(length).is_none() {
            return Err(Status::invalid_argument(format!(
                "read {i} of the sample plan ({} bytes at offset {offset}) must be 1 byte to --max-read ({max_read} \
                 bytes) of a shard",
                length
            )));
        }
        let next_use = (req.next_use[i] > 0).then_some(req.next_use[i]);
        reads.push(PlannedRead { position: req.position[i], shard, offset, length, next_use });
    }
    Ok((table, reads))
}

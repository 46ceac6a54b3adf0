//! The cache assembled: each part given the parts it uses, over what the store holds.

use std::sync::{Arc, Mutex};

use super::{Cache, CacheConfig};
use crate::{
    Result,
    fetch::FetchOwner,
    fetch::lookup::Lookups,
    fetch::suppliers::{Chain, Supply},
    observe::metrics::Metrics,
    plans::Plans,
    policy::{admit::AdmissionFilter, speculation::Speculation},
    read::ahead::ReadAhead,
    read::cold_open::ColdOpen,
    read::index_reads::IndexReads,
    read::path::ReadPath,
    store::Store,
    store::admission::Admission,
    store::capacity::Capacity,
    store::catalog::Catalog,
    store::evict::Evictor,
    store::kept::{Keeper, index::KeptSamples},
};

impl Cache {
    /// Loads what `store` holds; usable at once, before any hub answers. Chunks it lacks
    /// come from `chain`.
    pub fn open(store: Store, chain: Chain, config: CacheConfig, metrics: Arc<Metrics>) -> Result<Arc<Self>> {
        let store = Arc::new(store);
        let Stored { catalog, capacity, admission, keeper } = stored(&store, &config, &metrics)?;
        let chain = Arc::new(chain);
        let fetch = FetchOwner::new(
            chain.clone(),
            (admission.clone(), capacity.clone()),
            metrics.clone(),
            config.upstream_bytes_in_flight,
            config.chunk_size,
        );
        let lookups = Arc::new(
            Lookups::new(
                catalog.clone(),
                chain.clone() as Arc<dyn Supply>,
                (admission.clone(), keeper.clone()),
                metrics.clone(),
                config.chunk_size,
                config.empty_entries_kept,
            )
            .with_link_gate(fetch.link_gate()),
        );
        let plans = Arc::new(Plans::new(config.plan_limits));
        let filter = Arc::new(AdmissionFilter::new(config.capacity, config.chunk_size));
        let shares = Arc::new(config.tenant_shares.clone());
        let evictor = Evictor {
            capacity: capacity.clone(),
            catalog: catalog.clone(),
            plans: plans.clone(),
            admission: admission.clone(),
            keeper: keeper.clone(),
            shares: shares.clone(),
        };
        let read_ahead =
            Arc::new(read_ahead(&config, (evictor.clone(), plans.clone()), &fetch, filter.clone(), &metrics));
        let index_reads = Arc::new(IndexReads::default());
        let cold = ColdOpen {
            catalog: catalog.clone(),
            lookups: lookups.clone(),
            fetch: fetch.clone(),
            chain: chain.clone(),
            index_reads: index_reads.clone(),
            read_ahead: read_ahead.clone(),
            chunk_size: config.chunk_size,
        };
        let reads = ReadPath {
            store: store.clone(),
            plans: plans.clone(),
            filter,
            fetch: fetch.clone(),
            admission: admission.clone(),
            keeper: keeper.clone(),
            capacity: capacity.clone(),
            chain: chain.clone(),
            index_reads,
            read_ahead,
            metrics: metrics.clone(),
        };
        Ok(Arc::new(Self {
            evictor,
            config,
            store,
            catalog,
            capacity,
            admission,
            keeper,
            lookups,
            fetch,
            chain,
            plans,
            metrics,
            pinning: tokio::sync::Mutex::new(()),
            cold,
            reads,
        }))
    }
}

/// The bets beyond a read, over the parts the evictor uses (`read/ahead.rs`).
fn read_ahead(
    config: &CacheConfig,
    (evictor, plans): (Evictor, Arc<Plans>),
    fetch: &FetchOwner,
    filter: Arc<AdmissionFilter>,
    metrics: &Arc<Metrics>,
) -> ReadAhead {
    ReadAhead {
        fetch_whole_shard: config.fetch_whole_shard,
        read_ahead_chunks: config.read_ahead_chunks,
        shard_fetch_parallelism: config.shard_fetch_parallelism,
        capacity: evictor.capacity.clone(),
        plans,
        filter,
        admission: evictor.admission.clone(),
        fetch: fetch.clone(),
        evictor,
        metrics: metrics.clone(),
        victims: Mutex::default(),
        whole_fetches: Arc::default(),
    }
}

/// The parts over the store ([`stored`]).
struct Stored {
    catalog: Arc<Catalog>,
    capacity: Arc<Capacity>,
    admission: Arc<Admission>,
    keeper: Arc<Keeper>,
}

/// What `store` holds, loaded: the catalog (records with the chunks their files hold;
/// files of no record are gone), the kept samples (named by shard version: they load
/// whatever the records say), the capacity with both counted, the admission over them and
/// the keeper of the samples.
fn stored(store: &Arc<Store>, config: &CacheConfig, metrics: &Arc<Metrics>) -> Result<Stored> {
    let (catalog, used) = Catalog::load(store.clone(), config.chunk_size, config.revalidate_after)?;
    let catalog = Arc::new(catalog);
    let (kept, kept_bytes) = KeptSamples::load(store.load_packs()?);
    let capacity = Arc::new(
        Capacity::new(config.capacity, config.high_watermark, config.low_watermark, used + kept_bytes)
            .with_chunk_files(config.chunk_size),
    );
    let speculation = Arc::new(Speculation::new(config.capacity));
    let admission = Arc::new(Admission::new(
        store.clone(),
        catalog.clone(),
        (capacity.clone(), speculation),
        metrics.clone(),
    ));
    let keeper = Arc::new(Keeper::new(kept, admission.clone(), metrics.clone()));
    Ok(Stored { catalog, capacity, admission, keeper })
}

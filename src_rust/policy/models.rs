//! The models a pool serves. Each worker serves one model (empty: the
//! unnamed model of a deployment that names none) and, optionally, adapters
//! on it; a request names a model, or `model:adapter`, and is routed only
//! among the workers that serve exactly that. Names are interned, so the
//! filter a decision applies per worker is an integer compare. An adapter
//! may also be asked for by its own name, as vLLM serves it, where that
//! name is no model's and exactly one model has such an adapter
//! (`Models::adapter_homes`).

use hashbrown::HashMap;

/// Between a model and an adapter in the name a request asks for.
pub const ADAPTER_SEPARATOR: char = ':';

/// An interned model name (`model` or `model:adapter`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(u64);

impl ModelId {
    /// The unnamed model: what a worker or request that names none serves
    /// or asks for.
    pub const UNNAMED: ModelId = ModelId(0);
}

/// What one worker serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Serves {
    pub model: String,
    pub adapters: Vec<String>,
}

impl Serves {
    pub fn model(model: &str) -> Serves {
        Serves {
            model: model.to_owned(),
            adapters: Vec::new(),
        }
    }

    /// The names a request may ask for to reach this worker: the model, and
    /// `model:adapter` for each adapter.
    fn names(&self) -> impl Iterator<Item = String> + '_ {
        std::iter::once(self.model.clone()).chain(
            self.adapters
                .iter()
                .map(|a| format!("{}{ADAPTER_SEPARATOR}{a}", self.model)),
        )
    }
}

/// The names registered workers serve, each with how many serve it. A name
/// no worker serves any more is forgotten: a request for it is unknown.
#[derive(Debug)]
pub struct Models {
    ids: HashMap<String, (ModelId, usize)>,
    next: u64,
}

impl Default for Models {
    fn default() -> Self {
        Models {
            ids: HashMap::new(),
            next: ModelId::UNNAMED.0,
        }
    }
}

impl Models {
    /// The ids of what `serves` names, counted as served by one more worker.
    pub fn serve(&mut self, serves: &Serves) -> Vec<ModelId> {
        let mut out: Vec<ModelId> = Vec::new();
        for name in serves.names() {
            let next = &mut self.next;
            let (id, workers) = self.ids.entry(name).or_insert_with_key(|name| {
                if name.is_empty() {
                    (ModelId::UNNAMED, 0)
                } else {
                    *next += 1;
                    (ModelId(*next), 0)
                }
            });
            if !out.contains(id) {
                *workers += 1;
                out.push(*id);
            }
        }
        out
    }

    /// One worker fewer serves each of `ids`.
    pub fn unserve(&mut self, ids: &[ModelId]) {
        self.ids.retain(|_, (id, workers)| {
            if ids.contains(id) {
                *workers -= 1;
            }
            *workers > 0
        });
    }

    /// The id a request's model name resolves to. The unnamed model is
    /// always known: a deployment that names no model routes as it always
    /// has, refusing with "no worker" while none is registered.
    pub fn resolve(&self, name: &str) -> Option<ModelId> {
        if name.is_empty() {
            return Some(ModelId::UNNAMED);
        }
        self.ids.get(name).map(|(id, _)| *id)
    }

    /// The served `model:adapter` names whose adapter is called `name`, with
    /// their ids, sorted: what a request that names an adapter by itself
    /// may mean. Empty for a name that is served as it is or holds the
    /// separator.
    pub fn adapter_homes(&self, name: &str) -> Vec<(&str, ModelId)> {
        if name.is_empty() || name.contains(ADAPTER_SEPARATOR) || self.ids.contains_key(name) {
            return Vec::new();
        }
        let mut homes: Vec<_> = self
            .ids
            .iter()
            .filter(|(served, _)| adapter_of(served) == Some(name))
            .map(|(served, (id, _))| (served.as_str(), *id))
            .collect();
        homes.sort_unstable();
        homes
    }

    /// Every name served, with its id, sorted by name: the models,
    /// `model:adapter` for each adapter, and an adapter's own name where it
    /// stands for exactly one of those.
    pub fn names(&self) -> Vec<(&str, ModelId)> {
        let mut out: Vec<_> = self
            .ids
            .iter()
            .map(|(name, (id, _))| (name.as_str(), *id))
            .collect();
        let mut homes: HashMap<&str, Vec<ModelId>> = HashMap::new();
        for (name, id) in &out {
            if let Some(adapter) = adapter_of(name).filter(|a| !self.ids.contains_key(*a)) {
                homes.entry(adapter).or_default().push(*id);
            }
        }
        out.extend(
            homes
                .into_iter()
                .filter_map(|(adapter, ids)| matches!(ids[..], [_]).then(|| (adapter, ids[0]))),
        );
        out.sort_unstable();
        out
    }
}

/// The adapter of a served `model:adapter` name; None for a model's.
fn adapter_of(served: &str) -> Option<&str> {
    served
        .split_once(ADAPTER_SEPARATOR)
        .map(|(_, adapter)| adapter)
}

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

    /// The served `model:adapter` names that `name` may stand for (see
    /// `alias_of`), with their ids, sorted: what a request that names an
    /// adapter by itself may mean. Empty for a name that is served as it
    /// is, and for one no adapter is called.
    pub fn adapter_homes(&self, name: &str) -> Vec<(&str, ModelId)> {
        if name.is_empty() || self.ids.contains_key(name) {
            return Vec::new();
        }
        let mut homes: Vec<_> = self
            .ids
            .iter()
            .filter(|(served, _)| self.alias_of(served) == Some(name))
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
            if let Some(alias) = self.alias_of(name) {
                homes.entry(alias).or_default().push(*id);
            }
        }
        out.extend(
            homes
                .into_iter()
                .filter(|(_, ids)| ids.len() == 1)
                .map(|(alias, ids)| (alias, ids[0])),
        );
        out.sort_unstable();
        out
    }

    /// The adapter's own name a served `model:adapter` may also be asked
    /// for by: its adapter, where the model is a named one served as such,
    /// and the adapter's name is not empty, holds no separator and is no
    /// served name itself. None for every other name.
    fn alias_of<'a>(&self, served: &'a str) -> Option<&'a str> {
        let (model, adapter) = served.split_once(ADAPTER_SEPARATOR)?;
        let plain = !adapter.is_empty() && !adapter.contains(ADAPTER_SEPARATOR);
        (plain
            && !model.is_empty()
            && self.ids.contains_key(model)
            && !self.ids.contains_key(adapter))
        .then_some(adapter)
    }
}

//! The pool filter: a request is decided among its model's workers only.

use super::*;

fn serving(model: &str, adapters: &[&str]) -> Serves {
    Serves {
        model: model.to_owned(),
        adapters: adapters.iter().map(|a| (*a).to_owned()).collect(),
    }
}

/// Workers 0 and 1 serve llama (1 with the sql adapter), 2 and 3 qwen, 4
/// names no model.
fn two_models(name: PolicyName) -> Policy {
    let mut p = Policy::new(PolicyConfig {
        policy: name,
        ..PolicyConfig::default()
    });
    let workers = [
        serving("llama", &[]),
        serving("llama", &["sql"]),
        serving("qwen", &[]),
        serving("qwen", &[]),
        serving("", &[]),
    ];
    for (id, serves) in workers.iter().enumerate() {
        p.pool
            .upsert_worker(WorkerId(id as u64), Role::Both, 16_384, serves);
    }
    p
}

fn request(p: &Policy, model: &str) -> Result<Request<'static>, RouteError> {
    Ok(Request {
        model: p.pool.model(model)?,
        num_tokens: 640,
        num_blocks: 10,
        block_size: 64,
        blocks: &[],
        session: None,
    })
}

/// The decode workers of 40 requests for `model`.
fn chosen(p: &mut Policy, model: &str) -> Vec<u64> {
    (0..40)
        .map(|i| {
            let r = request(p, model).unwrap();
            p.route(&format!("{model}-{i}"), r, &[], 0)
                .unwrap()
                .decode_worker
                .0
        })
        .collect()
}

#[test]
fn every_policy_keeps_each_model_to_its_own_workers() {
    for policy in PolicyName::ALL {
        let name = policy.name();
        let mut p = two_models(policy);
        let llama = chosen(&mut p, "llama");
        assert!(llama.iter().all(|w| *w < 2), "{name}: {llama:?}");
        let qwen = chosen(&mut p, "qwen");
        assert!(qwen.iter().all(|w| *w == 2 || *w == 3), "{name}: {qwen:?}");
        assert!(chosen(&mut p, "").iter().all(|w| *w == 4), "{name}");
        assert!(
            chosen(&mut p, "llama:sql").iter().all(|w| *w == 1),
            "{name}"
        );
    }
}

#[test]
fn a_model_no_worker_serves_is_unknown_and_one_all_unhealthy_is_unavailable() {
    let mut p = two_models(PolicyName::Kvrouter);
    assert_eq!(
        request(&p, "mistral"),
        Err(RouteError::UnknownModel("mistral".into()))
    );
    assert!(request(&p, "qwen:sql").is_err(), "qwen has no sql adapter");
    p.pool.set_healthy(WorkerId(2), false).unwrap();
    p.pool.set_healthy(WorkerId(3), false).unwrap();
    let r = request(&p, "qwen").unwrap();
    assert_eq!(
        p.route("q", r, &[], 0),
        Err(RouteError::NoWorker {
            blocks: 10,
            registered: 2
        })
    );
}

#[test]
fn the_unnamed_model_is_known_with_no_worker_as_before_models() {
    let p = Policy::new(PolicyConfig::default());
    assert_eq!(p.pool.model(""), Ok(ModelId::UNNAMED));
}

#[test]
fn a_worker_registered_again_with_another_model_moves_pools() {
    let mut p = two_models(PolicyName::RoundRobin);
    p.pool
        .upsert_worker(WorkerId(1), Role::Both, 16_384, &serving("qwen", &[]));
    assert!(chosen(&mut p, "llama").iter().all(|w| *w == 0));
    let qwen = chosen(&mut p, "qwen");
    assert!(qwen.contains(&1) && !qwen.contains(&0), "{qwen:?}");
    assert!(
        request(&p, "llama:sql").is_err(),
        "its adapter left with it"
    );
    p.pool.remove_worker(WorkerId(0)).unwrap();
    assert!(request(&p, "llama").is_err(), "no worker serves llama now");
}

/// The routable workers `models()` gives `name`.
fn routable(p: &Policy, name: &str) -> Option<usize> {
    p.pool
        .models()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, count)| count)
}

#[test]
fn models_counts_each_names_routable_workers() {
    let mut p = two_models(PolicyName::Kvrouter);
    p.pool.set_healthy(WorkerId(3), false).unwrap();
    assert_eq!(routable(&p, "llama"), Some(2));
    assert_eq!(routable(&p, "llama:sql"), Some(1));
    assert_eq!(routable(&p, "qwen"), Some(1));
    assert_eq!(routable(&p, ""), Some(1));
    assert_eq!(routable(&p, "sql"), Some(1), "the adapter by its own name");
    assert_eq!(p.pool.models().len(), 5);
}

#[test]
fn a_model_served_only_by_prefill_workers_is_not_routable() {
    let mut p = two_models(PolicyName::Kvrouter);
    // Workers registered in turn, and their model's routable count after each.
    let steps = [
        (7, Role::Prefill, "mistral", 0),
        (8, Role::Decode, "mistral", 1),
        (2, Role::Prefill, "qwen", 1),
    ];
    for (id, role, model, expected) in steps {
        p.pool
            .upsert_worker(WorkerId(id), role, 16_384, &serving(model, &[]));
        assert_eq!(routable(&p, model), Some(expected), "worker {id}, {role:?}");
        if expected == 0 {
            let r = request(&p, model).unwrap();
            assert!(
                p.route("r", r, &[], 0).is_err(),
                "a prefill worker alone answers nothing"
            );
        }
    }
}

#[test]
fn an_adapter_named_by_itself_is_the_one_model_s_adapter_of_that_name() {
    let mut p = two_models(PolicyName::Kvrouter);
    assert!(chosen(&mut p, "sql").iter().all(|w| *w == 1));
    assert_eq!(p.pool.canonical_model("sql"), Ok(Some("llama:sql".into())));
    assert_eq!(routable(&p, "sql"), Some(1));
    for served in ["llama", "llama:sql", "", "mistral"] {
        assert_eq!(p.pool.canonical_model(served), Ok(None), "{served:?}");
    }

    p.pool
        .upsert_worker(WorkerId(3), Role::Both, 16_384, &serving("qwen", &["sql"]));
    let ambiguous = RouteError::AmbiguousAdapter {
        name: "sql".into(),
        models: "llama:sql, qwen:sql".into(),
    };
    assert_eq!(request(&p, "sql"), Err(ambiguous.clone()));
    assert_eq!(p.pool.canonical_model("sql"), Err(ambiguous));
    assert_eq!(routable(&p, "sql"), None, "listed only where it names one");

    p.pool
        .upsert_worker(WorkerId(5), Role::Both, 16_384, &serving("sql", &[]));
    let r = request(&p, "sql").unwrap();
    assert_eq!(
        p.route("model-sql", r, &[], 0).unwrap().decode_worker,
        WorkerId(5),
        "a model of that name is meant"
    );
}

#[test]
fn only_a_named_model_s_plain_adapter_is_asked_for_by_its_own_name() {
    let mut p = Policy::new(PolicyConfig::default());
    let workers = [
        serving("qwen2:7b", &[]),
        serving("", &["sql"]),
        serving("llama", &["", "a:b"]),
    ];
    for (id, serves) in workers.iter().enumerate() {
        p.pool
            .upsert_worker(WorkerId(id as u64), Role::Both, 16_384, serves);
    }
    for name in ["7b", "sql", "b"] {
        assert_eq!(routable(&p, name), None, "{name}");
        assert_eq!(
            request(&p, name),
            Err(RouteError::UnknownModel(name.into()))
        );
        assert_eq!(p.pool.canonical_model(name), Ok(None), "{name}");
    }
}

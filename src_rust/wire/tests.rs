use super::*;
use crate::ids::WorkerId;
use crate::index::TierDepths;
use crate::policy::{Candidate as Scored, Cost, Decision, RouteError as PolicyError};
use crate::routing::{Code, Refusal};
use prost::Message;

const LIMITS: Limits = Limits {
    max_prompt_tokens: 8,
    max_namespace_chars: 4,
    max_model_chars: 5,
    max_request_id_chars: 6,
};

fn encoded(request: RouteRequest) -> Vec<u8> {
    request.encode_to_vec()
}

fn refusal(bytes: &[u8]) -> (String, Refusal) {
    parse(bytes, &LIMITS).expect_err("refused")
}

fn prompt(tokens: Vec<u32>) -> RouteRequest {
    RouteRequest {
        tokens,
        ..Default::default()
    }
}

#[test]
fn packed_and_repeated_prompts_decode_alike() {
    let packed: Vec<u8> = [7u32, 8, 9].iter().flat_map(|t| t.to_le_bytes()).collect();
    let a = parse(
        &encoded(RouteRequest {
            tokens_u32le: packed,
            ..Default::default()
        }),
        &LIMITS,
    )
    .unwrap();
    let b = parse(&encoded(prompt(vec![7, 8, 9])), &LIMITS).unwrap();
    assert_eq!(a.tokens, vec![7, 8, 9]);
    assert_eq!(a.tokens, b.tokens);
}

#[test]
fn the_session_id_is_carried() {
    let request = RouteRequest {
        session_id: "chat-1".into(),
        ..prompt(vec![1])
    };
    assert_eq!(parse(&encoded(request), &LIMITS).unwrap().session, "chat-1");
}

#[test]
fn each_bad_request_is_refused_as_invalid_with_its_reason() {
    let cases: Vec<(RouteRequest, &str)> = vec![
        (prompt(vec![]), "the prompt is empty"),
        (
            prompt(vec![1; 9]),
            "the prompt has 9 tokens; this router accepts at most 8",
        ),
        (
            RouteRequest {
                tokens: vec![1],
                tokens_u32le: vec![0; 4],
                ..Default::default()
            },
            "set only one of tokens and tokens_u32le",
        ),
        (
            RouteRequest {
                tokens_u32le: vec![0; 5],
                ..Default::default()
            },
            "tokens_u32le has 5 bytes, not a multiple of 4",
        ),
        (
            RouteRequest {
                tokens: vec![1],
                namespace: "abcde".into(),
                ..Default::default()
            },
            "namespace is 5 characters; the limit is 4",
        ),
        (
            RouteRequest {
                tokens: vec![1],
                namespace: "a\u{7}".into(),
                ..Default::default()
            },
            "namespace must not contain control characters",
        ),
        (
            RouteRequest {
                tokens: vec![1],
                model: "llama3".into(),
                ..Default::default()
            },
            "model is 6 characters; the limit is 5",
        ),
        (
            RouteRequest {
                tokens: vec![1],
                model: "a\nb".into(),
                ..Default::default()
            },
            "model must not contain control characters",
        ),
        (
            RouteRequest {
                request_id: "r234567".into(),
                tokens: vec![1],
                ..Default::default()
            },
            "request_id is longer than 6 characters",
        ),
        (
            RouteRequest {
                tokens: vec![1],
                session_id: "s".repeat(MAX_SESSION_CHARS + 1),
                ..Default::default()
            },
            "session_id is 257 characters; the limit is 256",
        ),
        (
            RouteRequest {
                tokens: vec![1],
                session_id: "a\tb".into(),
                ..Default::default()
            },
            "session_id must not contain control characters",
        ),
    ];
    for (request, reason) in cases {
        let id = request.request_id.clone();
        let (got_id, refused) = refusal(&encoded(request));
        assert_eq!(refused.code, Code::InvalidArgument);
        assert_eq!(refused.message, reason);
        assert_eq!(got_id, id);
    }
}

#[test]
fn malformed_bytes_are_refused_not_panicked_on() {
    for bytes in [
        &[0xff_u8][..],
        &[0x12, 0x05, 0x01],
        &[0x0a, 0x02, 0xc3, 0x28],
    ] {
        let (_, refused) = refusal(bytes);
        assert_eq!(refused.code, Code::InvalidArgument);
        assert!(refused.message.starts_with("malformed RouteRequest"));
    }
}

#[test]
fn policy_errors_map_to_their_status_codes() {
    let code = |e: PolicyError| Refusal::from(e).code;
    assert_eq!(
        code(PolicyError::DuplicateRequest("r".into())),
        Code::InvalidArgument
    );
    assert_eq!(
        code(PolicyError::NoWorker {
            blocks: 1,
            registered: 0
        }),
        Code::Unavailable
    );
    assert_eq!(code(PolicyError::UnknownWorker(3)), Code::Internal);
    assert_eq!(
        code(PolicyError::UnknownModel("llama".into())),
        Code::NotFound
    );
}

fn scored(worker: u64, device: u32) -> Scored {
    Scored {
        worker: WorkerId(worker),
        overlap: TierDepths {
            device,
            host: 1,
            disk: 0,
        },
        cost: Cost {
            queue_ms: 1.0,
            prefill_ms: 2.0,
            ..Default::default()
        },
        active_requests: 3,
        overloaded: false,
    }
}

fn split_decision() -> Decision {
    Decision {
        decode_worker: WorkerId(2),
        prefill_worker: Some(WorkerId(5)),
        predicted_ttft_ms: 12.5,
        prefill_tokens: 100,
        reason: "lowest predicted TTFT".into(),
        by_affinity: false,
        decode_candidates: vec![scored(1, 0), scored(2, 4)],
        prefill_candidates: vec![scored(5, 2), scored(6, 0)],
    }
}

#[test]
fn a_response_shows_the_chosen_workers_or_every_candidate_when_explained() {
    let mut directory = Directory::default();
    directory.set(WorkerId(2), "decode".into(), "10.0.0.2:9000".into());
    directory.set(WorkerId(5), "prefill".into(), "10.0.0.5:9000".into());
    let decision = split_decision();

    let short = directory.response("r1", &decision, 7, false);
    assert_eq!(short.request_id, "r1");
    assert_eq!((short.decode_worker, short.prefill_worker), (2, Some(5)));
    assert!(short.disaggregated);
    assert_eq!(short.decode_address, "10.0.0.2:9000");
    assert_eq!(short.prefill_address, "10.0.0.5:9000");
    assert_eq!(short.num_blocks, 7);
    let explanation = short.explanation.as_ref().unwrap();
    assert_eq!(explanation.reason, "lowest predicted TTFT");
    let shown: Vec<u64> = explanation
        .decode_candidates
        .iter()
        .map(|c| c.worker_id)
        .collect();
    assert_eq!(shown, vec![2]);
    let winner = &explanation.decode_candidates[0];
    assert_eq!(
        (
            winner.role.as_str(),
            winner.overlap_device,
            winner.overlap_host
        ),
        ("decode", 4, 1)
    );
    assert_eq!((winner.cost_ms, winner.active_requests), (3.0, 3));
    assert_eq!(explanation.prefill_candidates.len(), 1);

    let full = directory.response("r1", &decision, 7, true);
    let explanation = full.explanation.unwrap();
    assert_eq!(explanation.decode_candidates.len(), 2);
    assert_eq!(explanation.prefill_candidates.len(), 2);
    assert_eq!(
        explanation.decode_candidates[0].role, "",
        "unknown workers have no role"
    );

    let round_trip = RouteResponse::decode(&*short.encode_to_vec()).unwrap();
    assert_eq!(round_trip, short);
}

#[test]
fn an_aggregated_decision_has_no_prefill_worker() {
    let decision = Decision {
        prefill_worker: None,
        prefill_candidates: vec![],
        ..split_decision()
    };
    let response = Directory::default().response("r", &decision, 1, false);
    assert_eq!(response.prefill_worker, None);
    assert!(!response.disaggregated);
    assert_eq!(response.prefill_address, "");
}

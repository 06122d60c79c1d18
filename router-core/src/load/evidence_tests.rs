use super::*;

/// A finished request of `blocks` blocks of which the index believed the pod held
/// `believed`, whose response reported `cached` of `prompt` tokens.
fn done(blocks: u64, believed: u64, prompt: u64, cached: Option<u64>) -> Completed {
    Completed {
        blocks,
        prefill_blocks: blocks - believed,
        ttft: 100,
        decode: 100,
        usage: Some(Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: 8,
        }),
        sent_to_idle: false,
        behind_copy: false,
    }
}

fn observe(evidence: &CacheEvidence, done: &Completed) -> Option<Verdict> {
    let done = Completed {
        usage: done.usage.map(|usage| evidence.normalize(usage)),
        ..*done
    };
    evidence.observe(&done)
}

#[test]
fn a_report_that_agrees_with_the_index_changes_nothing() {
    let evidence = CacheEvidence::default();
    // 40 blocks of 5 000 tokens, 36 believed; vLLM reports 4 496 (the last engine block
    // and the rounding between bytes and tokens are within the slack of 2 blocks).
    assert_eq!(
        observe(&evidence, &done(40, 36, 5000, Some(4496))),
        Some(Verdict::Confirmed)
    );
    // A cold prompt the index knew nothing of, and nothing hit.
    assert_eq!(
        observe(&evidence, &done(40, 0, 5000, Some(0))),
        Some(Verdict::Confirmed)
    );
    assert_eq!(evidence.trust(), CacheTrust::default());
    assert_eq!(evidence.trust().expected_held(40, 36, 1.0), 36);
}

#[test]
fn blocks_the_replica_had_lost_lower_what_its_other_beliefs_are_worth() {
    let evidence = CacheEvidence::default();
    observe(&evidence, &done(40, 40, 5000, Some(4992)));
    // The replica restarted: the next prompt the index believed whole hit nothing.
    assert_eq!(
        observe(&evidence, &done(40, 40, 5000, Some(0))),
        Some(Verdict::Missed)
    );
    let trust = evidence.trust();
    // Two responses, 80 believed blocks (the first decayed by 1/32), 40 missed.
    let believed = 40.0 * (1.0 - DECAY) + 40.0;
    assert!(
        (trust.held - (1.0 - 40.0 / believed)).abs() < 1e-12,
        "{trust:?}"
    );
    assert_eq!(trust.unheld, 0.0);
    // A prompt believed held at 30 of 40 blocks is now expected at about half of that.
    assert_eq!(trust.expected_held(40, 30, 1.0), 15);
    assert_eq!(
        trust.expected_held(40, 30, 0.0),
        30,
        "weight 0: the index as is"
    );
    // More misses drive it towards nothing: prefix caching off, say.
    for _ in 0..40 {
        observe(&evidence, &done(40, 40, 5000, Some(0)));
    }
    assert!(evidence.trust().held < 0.3, "{:?}", evidence.trust());
}

#[test]
fn blocks_the_index_never_credited_raise_what_the_others_are_worth() {
    let evidence = CacheEvidence::default();
    // Warm-up traffic went straight to the engine: a prompt the index thought cold there
    // hit 36 of its 40 blocks.
    assert_eq!(
        observe(&evidence, &done(40, 0, 5000, Some(4500))),
        Some(Verdict::Surprised)
    );
    let trust = evidence.trust();
    assert_eq!(trust.held, 1.0);
    assert!((trust.unheld - 36.0 / 40.0).abs() < 1e-12, "{trust:?}");
    // Another cold-looking prompt there is expected to be mostly held.
    assert_eq!(trust.expected_held(40, 0, 1.0), 36);
    assert_eq!(trust.expected_held(40, 0, 0.5), 18);
}

#[test]
fn vllm_s_null_details_mean_zero_only_from_a_replica_that_reports_them() {
    let evidence = CacheEvidence::default();
    // Never reported: a vLLM without --enable-prompt-tokens-details. Nothing learned.
    assert_eq!(
        observe(&evidence, &done(40, 40, 5000, None)),
        Some(Verdict::Unreported)
    );
    assert_eq!(evidence.trust(), CacheTrust::default());
    observe(&evidence, &done(40, 40, 5000, Some(4992)));
    // Now a null means nothing hit.
    assert_eq!(
        observe(&evidence, &done(40, 40, 5000, None)),
        Some(Verdict::Missed)
    );
    assert!(evidence.trust().held < 1.0);
}

#[test]
fn what_teaches_nothing_is_ignored() {
    let evidence = CacheEvidence::default();
    let mut no_usage = done(40, 40, 5000, Some(0));
    no_usage.usage = None;
    assert_eq!(observe(&evidence, &no_usage), None);
    // random and least-request hash nothing.
    assert_eq!(observe(&evidence, &done(0, 0, 5000, Some(0))), None);
    let mut behind = done(40, 40, 5000, Some(0));
    behind.behind_copy = true;
    assert_eq!(observe(&evidence, &behind), None);
    assert_eq!(
        observe(&evidence, &done(40, 40, 5000, Some(5001))),
        Some(Verdict::Invalid)
    );
    assert_eq!(observe(&evidence, &done(40, 40, 0, Some(0))), None);
    assert_eq!(evidence.trust(), CacheTrust::default());
}

#[test]
fn old_evidence_fades() {
    let evidence = CacheEvidence::default();
    for _ in 0..8 {
        observe(&evidence, &done(40, 40, 5000, Some(0)));
    }
    assert!(evidence.trust().held < 0.01);
    // The replica caches again: 200 confirmed responses bring the trust back.
    for _ in 0..200 {
        observe(&evidence, &done(40, 40, 5000, Some(4992)));
    }
    assert!(evidence.trust().held > 0.99, "{:?}", evidence.trust());
}

#[test]
fn expected_held_stays_within_the_prompt() {
    let trust = CacheTrust {
        held: 0.0,
        unheld: 1.0,
    };
    assert_eq!(trust.expected_held(10, 4, 1.0), 6);
    assert_eq!(trust.expected_held(10, 20, 1.0), 0);
    assert_eq!(trust.expected_held(0, 0, 1.0), 0);
}

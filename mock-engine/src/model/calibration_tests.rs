//! Calibration checks of the `l20-qwen27b-fp8` profile against the seed's engine figures
//! (SPEC §4.3, `shared/seeds/matrix-24-phase.json`): warm TTFT p50 ≈ 0.29 s, TPOT p50 ≈
//! 0.058 s with up to 8 running, cold TTFT 2–4 s, a running peak of 8 with queueing beyond,
//! KV usage ≈ 0.29 with 8 cold requests running. Virtual time, generous bounds: these guard
//! the profile's shape, while fitting it to the seed is the simulator's job (issue 6).

use super::engine_tests::{request, run_to_idle};
use super::*;

const PREFIX: usize = 4704;
const PROMPT: usize = 5040;

fn l20() -> EngineModel {
    EngineModel::new(EngineProfile::builtin("l20-qwen27b-fp8").expect("builtin profile"))
}

/// A matrix-shaped prompt: family `family`'s 4704-token prefix and a private 336-token tail.
fn prompt(family: u32, tail: u32) -> Vec<u32> {
    let base = 10_000_000 * (family + 1);
    let mut prompt: Vec<u32> = (0..PREFIX as u32).map(|i| base + i).collect();
    let tail_base = base + 5_000_000 + tail * 1000;
    prompt.extend((0..(PROMPT - PREFIX) as u32).map(|i| tail_base + i));
    prompt
}

/// A prompt that shares nothing with any other.
fn cold_prompt(n: u32) -> Vec<u32> {
    (0..PROMPT as u32)
        .map(|i| 500_000_000 + n * 10_000 + i)
        .collect()
}

/// Primes `family`'s prefix and runs the engine idle again.
fn prime(engine: &mut EngineModel, family: u32) {
    engine
        .submit(request(prompt(family, 999), 1), 0.0)
        .expect("valid");
    run_to_idle(engine, 1000);
}

fn ttft_of(outputs: &[TokenOutput], id: RequestId, submitted: Seconds) -> Seconds {
    let first = outputs.iter().find(|o| o.id == id && o.index == 0);
    first.expect("request produced a first token").at - submitted
}

fn tpot_of(outputs: &[TokenOutput], id: RequestId) -> Seconds {
    let mine: Vec<&TokenOutput> = outputs.iter().filter(|o| o.id == id).collect();
    let (first, last) = (mine[0].at, mine[mine.len() - 1].at);
    (last - first) / (mine.len() - 1) as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[test]
fn an_isolated_warm_request_has_ttft_near_a_quarter_second() {
    let mut engine = l20();
    prime(&mut engine, 0);
    let t = 100.0;
    let id = engine.submit(request(prompt(0, 1), 128), t).expect("valid");
    let outputs = run_to_idle(&mut engine, 1000);
    let ttft = ttft_of(&outputs, id, t);
    println!("isolated warm TTFT = {ttft:.3} s");
    assert_eq!(outputs[0].cached_tokens, PREFIX as u32);
    assert!((0.2..=0.4).contains(&ttft), "warm TTFT {ttft}");
}

#[test]
fn a_warm_request_joining_seven_decoders_has_ttft_near_the_seed() {
    let mut engine = l20();
    for family in 0..8 {
        prime(&mut engine, family);
    }
    // Seven warm requests of different families, staggered so all are decoding (a request
    // lives ≈ 7 s here) when the eighth arrives.
    let start = 100.0;
    for i in 0..7u32 {
        let at = start + 0.3 * f64::from(i);
        engine.advance(at);
        engine
            .submit(request(prompt(i, i), 128), at)
            .expect("valid");
    }
    let t = start + 0.3 * 7.0 + 0.5;
    let mut outputs = engine.advance(t);
    assert_eq!(engine.num_running(), 7, "the seven are still decoding");
    let id = engine.submit(request(prompt(7, 7), 128), t).expect("valid");
    outputs.extend(run_to_idle(&mut engine, 5000));
    let ttft = ttft_of(&outputs, id, t);
    println!("warm TTFT beside 7 decoders = {ttft:.3} s");
    assert!((0.2..=0.4).contains(&ttft), "warm TTFT {ttft}");
}

#[test]
fn eight_concurrent_warm_requests_decode_near_the_seed_tpot() {
    let mut engine = l20();
    prime(&mut engine, 0);
    let ids: Vec<RequestId> = (0..8)
        .map(|i| {
            engine
                .submit(request(prompt(0, i), 128), 100.0)
                .expect("valid")
        })
        .collect();
    let mut outputs = Vec::new();
    let mut running_peak = 0;
    for _ in 0..5000 {
        let Some(at) = engine.next_wakeup() else {
            break;
        };
        outputs.extend(engine.advance(at));
        running_peak = running_peak.max(engine.num_running());
    }
    let tpot = median(ids.iter().map(|id| tpot_of(&outputs, *id)).collect());
    println!("TPOT p50 at 8 running = {tpot:.4} s");
    assert_eq!(running_peak, 8);
    assert!((0.05..=0.07).contains(&tpot), "TPOT {tpot}");
}

#[test]
fn an_isolated_cold_request_has_ttft_of_a_few_seconds() {
    let mut engine = l20();
    let id = engine
        .submit(request(cold_prompt(0), 128), 0.0)
        .expect("valid");
    let outputs = run_to_idle(&mut engine, 1000);
    let ttft = ttft_of(&outputs, id, 0.0);
    println!("isolated cold TTFT = {ttft:.3} s");
    assert_eq!(outputs[0].cached_tokens, 0);
    assert!((1.5..=3.0).contains(&ttft), "cold TTFT {ttft}");
}

#[test]
fn a_cold_request_behind_another_waits_for_the_budget() {
    let mut engine = l20();
    let first = engine
        .submit(request(cold_prompt(0), 128), 0.0)
        .expect("valid");
    let second = engine
        .submit(request(cold_prompt(1), 128), 0.0)
        .expect("valid");
    let outputs = run_to_idle(&mut engine, 1000);
    let (a, b) = (
        ttft_of(&outputs, first, 0.0),
        ttft_of(&outputs, second, 0.0),
    );
    println!("two cold requests together: TTFT {a:.3} s and {b:.3} s");
    assert!(a < b, "FCFS: the first gets the budget first");
    assert!((2.5..=4.0).contains(&b), "second cold TTFT {b}");
}

#[test]
fn a_ninth_request_waits_and_kv_usage_peaks_near_the_seed() {
    let mut engine = l20();
    for n in 0..9 {
        engine
            .submit(request(cold_prompt(n), 128), 0.0)
            .expect("valid");
    }
    let mut usage_peak: f64 = 0.0;
    let mut waiting_peak = 0;
    for _ in 0..10_000 {
        let Some(at) = engine.next_wakeup() else {
            break;
        };
        engine.advance(at);
        assert!(engine.num_running() <= 8);
        waiting_peak = waiting_peak.max(engine.num_waiting());
        if engine.num_running() == 8 {
            usage_peak = usage_peak.max(engine.kv_usage());
        }
    }
    println!("kv usage peak with 8 cold running = {usage_peak:.3}");
    assert!(waiting_peak >= 1, "the ninth request queued");
    assert!((0.25..=0.35).contains(&usage_peak), "usage {usage_peak}");
    assert_eq!(engine.metrics().request_success.length, 9);
    assert_eq!(
        engine.metrics().preemptions,
        0,
        "140k tokens of KV hold 8 of these"
    );
}

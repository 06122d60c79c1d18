//! One request's state inside the engine (vLLM's `Request`): its tokens so far, how many of
//! them have KV computed, the blocks it holds, and the timestamps the metrics need.

use super::block_hash::extend_hashes;
use super::block_pool::BlockId;
use super::{RequestId, Seconds};

#[derive(Clone, Debug)]
pub struct Sequence {
    pub id: RequestId,
    /// Prompt followed by the tokens generated so far.
    pub tokens: Vec<u32>,
    pub num_prompt: usize,
    pub max_tokens: u32,
    /// Tokens whose KV is computed (or scheduled to be by the step in flight).
    pub num_computed: usize,
    /// KV blocks held, in token order.
    pub blocks: Vec<BlockId>,
    /// Chained hashes of every full block of `tokens`.
    pub block_hashes: Vec<u64>,
    /// How many leading entries of `blocks` are already registered in the prefix cache.
    pub num_cached_blocks: usize,
    /// Submit time: TTFT and E2E are measured from here (vLLM's `arrival_time`).
    pub arrival: Seconds,
    /// When the frontend overhead ends and the request enters the waiting queue.
    pub ready_at: Seconds,
    /// First time the scheduler gave it work (not reset by preemption).
    pub first_scheduled: Option<Seconds>,
    pub first_token_at: Option<Seconds>,
    pub last_token_at: Option<Seconds>,
    /// Prefix-cache hit when first scheduled (`usage.prompt_tokens_details.cached_tokens`).
    pub cached_tokens: Option<usize>,
}

impl Sequence {
    pub fn new(
        id: RequestId,
        prompt: Vec<u32>,
        max_tokens: u32,
        arrival: Seconds,
        ready_at: Seconds,
    ) -> Sequence {
        let num_prompt = prompt.len();
        Sequence {
            id,
            tokens: prompt,
            num_prompt,
            max_tokens,
            num_computed: 0,
            blocks: Vec::new(),
            block_hashes: Vec::new(),
            num_cached_blocks: 0,
            arrival,
            ready_at,
            first_scheduled: None,
            first_token_at: None,
            last_token_at: None,
            cached_tokens: None,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn num_output(&self) -> usize {
        self.tokens.len() - self.num_prompt
    }

    /// Tokens still to compute before the next token can be sampled.
    pub fn remaining(&self) -> usize {
        self.num_tokens().saturating_sub(self.num_computed)
    }

    /// Brings `block_hashes` up to date with `tokens`.
    pub fn refresh_hashes(&mut self, block_size: usize) {
        extend_hashes(&mut self.block_hashes, &self.tokens, block_size);
    }

    pub fn prompt_tokens_u32(&self) -> u32 {
        u32::try_from(self.num_prompt).unwrap_or(u32::MAX)
    }

    pub fn cached_tokens_u32(&self) -> u32 {
        u32::try_from(self.cached_tokens.unwrap_or(0)).unwrap_or(u32::MAX)
    }
}

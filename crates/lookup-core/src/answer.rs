//! The answer rules of a lookup, shared by every party that computes one: the
//! reference server, the Mooncake index behind it, and a client that asks the
//! Mooncake master itself (`spec/wire.md`, "What the server computes").
//!
//! Pure arithmetic over token counts, block counts and existence flags: which leading
//! blocks are asked about, how long the run of present blocks is, and how many hit
//! tokens that run is worth.

/// How many leading blocks a lookup asks the index about: `min(block_hashes,
/// floor(num_tokens / block_size))`; 0 when there are no hashes or fewer tokens than a
/// block (`spec/wire.md`, "What the server computes", steps 1-2). A `block_size` of 0
/// gives 0.
#[must_use]
pub fn blocks_to_check(num_tokens: u32, block_size: u32, num_hashes: usize) -> usize {
    let aligned_blocks = num_tokens.checked_div(block_size).unwrap_or(0);
    usize::try_from(aligned_blocks).map_or(num_hashes, |b| b.min(num_hashes))
}

/// Hit tokens for a leading run of `leading_run` present blocks: `block_size *
/// leading_run`, except that a hit covering the whole prompt is recomputed with
/// `num_tokens - 1` as the limit, so the last prompt token is always recomputed
/// (`spec/wire.md`, "What the server computes", steps 3-4; vLLM #55113). 32 tokens
/// with both 16-token blocks present: 16; 33 tokens: 32.
///
/// `leading_run` is at most [`blocks_to_check`], so the result never exceeds
/// `num_tokens`; larger values are capped there too. A `block_size` of 0 gives 0.
///
/// The rule applies to both formats, with the token count as sent. A `msgpack-hex`
/// client floors it to the block size first, so an unaligned prompt whose every block
/// is stored (33 tokens, 2 blocks of 16) arrives as 32 and gets 16, one block less
/// than the prompt allows; the answer stays safe for clients that trust it.
#[must_use]
pub fn hit_tokens(num_tokens: u32, block_size: u32, leading_run: usize) -> u32 {
    let run = u64::try_from(leading_run).unwrap_or(u64::MAX);
    let b = u64::from(block_size);
    let aligned_blocks = u64::from(num_tokens.checked_div(block_size).unwrap_or(0));
    let mut blocks = run.min(aligned_blocks);
    if blocks * b >= u64::from(num_tokens) && num_tokens > 0 {
        blocks = blocks.min(u64::from((num_tokens - 1) / block_size));
    }
    // blocks * b <= num_tokens, a u32.
    u32::try_from(blocks * b).unwrap_or(0)
}

/// The number of leading blocks all of whose keys exist, given the index's flags for
/// block-major keys, `namespaces` per block (`spec/wire.md`, "What the server
/// computes", steps 2-3: a block is present only when every namespace key exists; the
/// first missing block ends the run).
#[must_use]
pub fn leading_run(present: &[bool], namespaces: usize) -> usize {
    if namespaces == 0 {
        return 0;
    }
    present
        .chunks(namespaces)
        .take_while(|block| block.len() == namespaces && block.iter().all(|&p| p))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_to_check_is_bounded_by_tokens_and_hashes() {
        assert_eq!(blocks_to_check(40, 16, 3), 2);
        assert_eq!(blocks_to_check(48, 16, 3), 3);
        assert_eq!(blocks_to_check(1000, 16, 3), 3);
        assert_eq!(blocks_to_check(15, 16, 3), 0);
        assert_eq!(blocks_to_check(48, 16, 0), 0);
        assert_eq!(blocks_to_check(48, 0, 3), 0);
    }

    #[test]
    fn hit_is_the_leading_run_in_tokens() {
        assert_eq!(hit_tokens(40, 16, 2), 32);
        assert_eq!(hit_tokens(40, 16, 1), 16);
        assert_eq!(hit_tokens(40, 16, 0), 0);
    }

    #[test]
    fn full_hit_recomputes_the_last_token() {
        // spec/wire.md step 4: 32 tokens, both 16-token blocks present → 16; 33 → 32.
        assert_eq!(hit_tokens(32, 16, 2), 16);
        assert_eq!(hit_tokens(33, 16, 2), 32);
        assert_eq!(hit_tokens(16, 16, 1), 0);
        assert_eq!(hit_tokens(1024, 512, 2), 512);
        // A run longer than the aligned prompt is capped, then the rule applies.
        assert_eq!(hit_tokens(32, 16, 9), 16);
        assert_eq!(hit_tokens(0, 16, 3), 0);
        assert_eq!(hit_tokens(32, 0, 2), 0);
        assert_eq!(hit_tokens(u32::MAX, 1, usize::MAX), u32::MAX - 1);
    }

    #[test]
    fn leading_run_needs_every_namespace() {
        assert_eq!(leading_run(&[true, true, false], 1), 2);
        assert_eq!(leading_run(&[true, false, true, true], 1), 1);
        assert_eq!(leading_run(&[true, true, true, false, true, true], 2), 1);
        assert_eq!(leading_run(&[true, true, true, true], 2), 2);
        // A trailing partial block (a short answer) never counts.
        assert_eq!(leading_run(&[true, true, true], 2), 1);
        assert_eq!(leading_run(&[], 2), 0);
        assert_eq!(leading_run(&[true], 0), 0);
    }
}

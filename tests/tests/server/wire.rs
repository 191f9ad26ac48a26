//! The reference `LookupServer` over real sockets: both wire formats of
//! `spec/wire.md` from REQ and DEALER clients, "What the server computes" (leading
//! run, full-hit rule, rank namespaces), and every kind of bad input.

use std::sync::Arc;

use bytes::Bytes;
use lookup_core::wire::{self, Format};
use lookup_server::{KeyLayout, RankNamespace, ServerConfig};
use lookup_tests::server::{
    FailingIndex, PanickingIndex, Req, ShortAnswerIndex, Transport, hit, key, lookup, start,
    start_with, store, store_unavailable,
};

const B: u32 = 16;

async fn leading_run_and_full_hit(transport: Transport) {
    let running = start(transport, B, KeyLayout::new("m"));
    // Blocks 1, 2 and 4 are stored; 3 is missing.
    store(&running.index, &running.layout, &[1, 2, 4]);
    let mut req = running.req();
    let tb = Format::TaggedBlob;

    // The missing third block ends the run.
    assert_eq!(
        hit(tb, &req.call(&lookup(tb, 64, B, &[1, 2, 3, 4])).await),
        32
    );
    // Only aligned blocks count: 40 tokens cover 2 blocks.
    assert_eq!(hit(tb, &req.call(&lookup(tb, 40, B, &[1, 2, 3])).await), 32);
    // Full hit: 32 tokens with both blocks present → 16; 33 → 32.
    assert_eq!(hit(tb, &req.call(&lookup(tb, 32, B, &[1, 2])).await), 16);
    assert_eq!(hit(tb, &req.call(&lookup(tb, 33, B, &[1, 2])).await), 32);
    // The first block missing: nothing.
    assert_eq!(hit(tb, &req.call(&lookup(tb, 48, B, &[9, 1, 2])).await), 0);
    // Fewer tokens than a block, or no hashes (an empty last frame after the
    // delimiter): 0.
    assert_eq!(hit(tb, &req.call(&lookup(tb, 15, B, &[1])).await), 0);
    assert_eq!(hit(tb, &req.call(&lookup(tb, 64, B, &[])).await), 0);

    let mh = Format::MsgpackHex;
    assert_eq!(
        hit(mh, &req.call(&lookup(mh, 64, B, &[1, 2, 3, 4])).await),
        32
    );
    assert_eq!(hit(mh, &req.call(&lookup(mh, 48, B, &[1, 2, 3])).await), 32);
    // msgpack-hex sends the token count floored to the block size, so a 33-token
    // prompt arrives as 32 and the full-hit rule keeps the last block back.
    assert_eq!(hit(mh, &req.call(&lookup(mh, 33, B, &[1, 2])).await), 16);
    // The server uses the count as sent: an unfloored 33 gets 32.
    let mut unfloored = lookup(mh, 32, B, &[1, 2]);
    unfloored[0] = Bytes::copy_from_slice(&33u32.to_be_bytes());
    assert_eq!(hit(mh, &req.call(&unfloored).await), 32);
    assert_eq!(hit(mh, &req.call(&lookup(mh, 64, B, &[])).await), 0);

    let stats = running.server.stats();
    assert_eq!(stats.requests, 12);
    assert_eq!(stats.lookups, 12);
    assert_eq!(stats.decode_errors, 0);
    assert_eq!(stats.replies, 12);
    // Keys asked: 4 + 2 + 2 + 2 + 3 + 0 + 0 | 4 + 3 + 2 + 2 + 0.
    assert_eq!(stats.keys_checked, 13 + 11);
    assert_eq!(stats.hit_tokens, (32 + 32 + 16 + 32) + (32 + 32 + 16 + 32));
    running.server.shutdown().await;
}

#[tokio::test]
async fn req_client_both_formats_over_ipc() {
    leading_run_and_full_hit(Transport::Ipc).await;
}

#[tokio::test]
async fn req_client_both_formats_over_tcp() {
    leading_run_and_full_hit(Transport::Tcp).await;
}

#[tokio::test]
async fn dealer_envelope_is_echoed_in_both_formats() {
    for transport in [Transport::Ipc, Transport::Tcp] {
        let running = start(transport, B, KeyLayout::new("m"));
        store(&running.index, &running.layout, &[1, 2, 3]);
        let mut dealer = running.dealer();

        dealer
            .send_id(7, &lookup(Format::TaggedBlob, 49, B, &[1, 2, 3]))
            .await;
        let (id, reply) = dealer.recv_id().await;
        assert_eq!((id, hit(Format::TaggedBlob, &reply)), (7, 48));

        // Floored to 48 by the encoder: a full hit, so the last block is held back.
        dealer
            .send_id(8, &lookup(Format::MsgpackHex, 49, B, &[1, 2, 3]))
            .await;
        let (id, reply) = dealer.recv_id().await;
        assert_eq!((id, hit(Format::MsgpackHex, &reply)), (8, 32));

        // A longer envelope comes back whole, in order.
        dealer
            .send(
                &[b"route-a", b"rpc-9"],
                &lookup(Format::TaggedBlob, 32, B, &[1]),
            )
            .await;
        let reply = dealer.recv().await;
        assert_eq!(reply.len(), 4);
        assert_eq!(reply[0].as_ref(), b"route-a");
        assert_eq!(reply[1].as_ref(), b"rpc-9");
        assert!(reply[2].is_empty());
        assert_eq!(hit(Format::TaggedBlob, &reply[3..]), 16);
        running.server.shutdown().await;
    }
}

#[tokio::test]
async fn every_rank_namespace_key_is_needed() {
    let layout = KeyLayout::new("m")
        .with_cache_prefix(Some("pfx".to_owned()))
        .with_namespaces(RankNamespace::grid(2, 2))
        .unwrap();
    let running = start(Transport::Ipc, B, layout);
    store(&running.index, &running.layout, &[1, 2, 3, 4]);
    let mut req = running.req();
    let tb = Format::TaggedBlob;

    assert_eq!(
        hit(tb, &req.call(&lookup(tb, 65, B, &[1, 2, 3, 4])).await),
        64
    );
    // Block 2 loses the key of one rank namespace (tp 1, pp 0): the run ends before it.
    let missing = key(&running.layout, 2, 2);
    assert_eq!(
        missing,
        "pfx@m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@0000000000000002"
    );
    assert!(running.index.remove(&missing));
    assert_eq!(
        hit(tb, &req.call(&lookup(tb, 65, B, &[1, 2, 3, 4])).await),
        16
    );
    // 4 namespaces × 4 blocks per call.
    assert_eq!(running.server.stats().keys_checked, 32);
    running.server.shutdown().await;
}

#[tokio::test]
async fn malformed_lookups_get_hit_zero_and_are_counted() {
    let running = start(Transport::Ipc, B, KeyLayout::new("m"));
    store(&running.index, &running.layout, &[1, 2]);
    let mut req = running.req();

    // tagged-blob with a 3-byte num_tokens field.
    let mut frames = lookup(Format::TaggedBlob, 48, B, &[1, 2]);
    frames[1] = Bytes::from_static(&[0, 0, 48]);
    let reply = req.call(&frames).await;
    assert_eq!(reply, vec![Bytes::from_static(&[0, 0, 0, 0])]);

    // tagged-blob whose hash frame does not split into hashes of hash_len bytes.
    let mut frames = lookup(Format::TaggedBlob, 48, B, &[1, 2]);
    frames[3] = frames[3].slice(..15);
    assert_eq!(hit(Format::TaggedBlob, &req.call(&frames).await), 0);

    // tagged-blob claiming hashes of 65,535 bytes: refused before any allocation.
    let frames = vec![
        Bytes::from_static(b"lookup"),
        Bytes::from_static(&[0, 0, 0, 48]),
        Bytes::from_static(&[0xff, 0xff]),
        Bytes::from_static(&[1, 2, 3]),
    ];
    assert_eq!(hit(Format::TaggedBlob, &req.call(&frames).await), 0);

    // msgpack-hex whose array is not MessagePack.
    let frames = vec![
        Bytes::from_static(&[0, 0, 0, 32]),
        Bytes::from_static(&[0xc1]),
    ];
    let reply = req.call(&frames).await;
    assert_eq!(reply, vec![Bytes::from_static(&[0, 0, 0, 0])]);
    assert!(wire::decode_lookup_reply(Format::MsgpackHex, &reply).is_ok());

    // The server still answers well-formed lookups.
    assert_eq!(
        hit(
            Format::TaggedBlob,
            &req.call(&lookup(Format::TaggedBlob, 48, B, &[1, 2])).await
        ),
        32
    );
    let stats = running.server.stats();
    assert_eq!(stats.decode_errors, 4);
    assert_eq!(stats.lookups, 1);
    assert_eq!(stats.keys_checked, 2);
    running.server.shutdown().await;
}

#[tokio::test]
async fn unknown_tags_get_0x00() {
    let running = start(Transport::Tcp, B, KeyLayout::new("m"));
    let mut req = running.req();
    for frames in [
        vec![Bytes::from_static(b"hello")],
        vec![Bytes::from_static(b"reset"), Bytes::from_static(b"extra")],
        vec![Bytes::from_static(&[1, 2, 3]), Bytes::from_static(&[0x90])],
        vec![
            Bytes::from_static(b"a"),
            Bytes::from_static(b"b"),
            Bytes::from_static(b"c"),
        ],
    ] {
        assert_eq!(req.call(&frames).await, vec![Bytes::from_static(&[0x00])]);
    }
    assert_eq!(running.server.stats().unknown_tags, 4);
    running.server.shutdown().await;
}

#[tokio::test]
async fn message_without_delimiter_is_dropped_and_the_server_keeps_serving() {
    let running = start(Transport::Ipc, B, KeyLayout::new("m"));
    store(&running.index, &running.layout, &[1, 2]);
    let mut dealer = running.dealer();

    // A DEALER that forgets the delimiter: no envelope to answer on.
    dealer
        .send_raw(&lookup(Format::TaggedBlob, 48, B, &[1, 2]))
        .await;
    dealer.send_raw(&[Bytes::from_static(b"junk")]).await;
    dealer
        .send_id(2, &lookup(Format::TaggedBlob, 48, B, &[1, 2]))
        .await;
    // Messages from one peer are handled in order, so an answer to either dropped
    // message would arrive before this one.
    let (id, reply) = dealer.recv_id().await;
    assert_eq!((id, hit(Format::TaggedBlob, &reply)), (2, 32));

    let stats = running.server.stats();
    assert_eq!(stats.no_delimiter, 2);
    assert_eq!(stats.requests, 3);
    assert_eq!(stats.replies, 1);

    // A REQ client is served too.
    let mut req = running.req();
    assert_eq!(
        hit(
            Format::MsgpackHex,
            &req.call(&lookup(Format::MsgpackHex, 48, B, &[1, 2])).await
        ),
        32
    );
    running.server.shutdown().await;
}

#[tokio::test]
async fn reset_clears_the_index_and_answers_0x01() {
    let running = start(Transport::Ipc, B, KeyLayout::new("m"));
    store(&running.index, &running.layout, &[1, 2, 3]);
    let mut req = running.req();
    let tb = Format::TaggedBlob;

    assert_eq!(hit(tb, &req.call(&lookup(tb, 64, B, &[1, 2, 3])).await), 48);
    let reply = req.call(&wire::encode_reset(tb).unwrap()).await;
    assert_eq!(wire::decode_reset_reply(&reply), Ok(true));
    assert!(running.index.is_empty());
    assert_eq!(hit(tb, &req.call(&lookup(tb, 64, B, &[1, 2, 3])).await), 0);

    let stats = running.server.stats();
    assert_eq!(stats.resets, 1);
    assert_eq!(stats.reset_failures, 0);
    running.server.shutdown().await;
}

/// A failed index call is the store-unavailable error reply (`spec/wire.md`, "Store
/// unavailable"), the single byte `0x00` in both formats, never a miss.
#[tokio::test]
async fn failed_wipe_answers_0x00_and_failed_index_calls_answer_store_unavailable() {
    let (server, _dir) = start_with(
        Transport::Ipc,
        ServerConfig::new(B, KeyLayout::new("m")),
        Arc::new(FailingIndex),
    );
    let mut req = Req::connect(&tmq::Context::new(), server.local_endpoint());
    let tb = Format::TaggedBlob;
    let mh = Format::MsgpackHex;

    let reply = req.call(&lookup(tb, 64, B, &[1, 2, 3])).await;
    assert_eq!(reply[0].as_ref(), [0x00]);
    assert!(store_unavailable(tb, &reply));
    let reply = req.call(&lookup(mh, 64, B, &[1, 2, 3])).await;
    assert_eq!(reply[0].as_ref(), [0x00]);
    assert!(store_unavailable(mh, &reply));
    let reply = req.call(&wire::encode_reset(tb).unwrap()).await;
    assert_eq!(wire::decode_reset_reply(&reply), Ok(false));
    // A lookup with no block to check never reaches the index: a true miss.
    assert_eq!(hit(tb, &req.call(&lookup(tb, 8, B, &[1])).await), 0);

    let stats = server.stats();
    assert_eq!(stats.index_errors, 2);
    assert_eq!(stats.resets, 1);
    assert_eq!(stats.reset_failures, 1);
    assert_eq!(stats.lookups, 3);
    server.shutdown().await;
}

#[tokio::test]
async fn an_answer_of_the_wrong_length_is_an_index_error() {
    let (server, _dir) = start_with(
        Transport::Tcp,
        ServerConfig::new(B, KeyLayout::new("m")),
        Arc::new(ShortAnswerIndex),
    );
    let mut req = Req::connect(&tmq::Context::new(), server.local_endpoint());
    let tb = Format::TaggedBlob;
    assert!(store_unavailable(
        tb,
        &req.call(&lookup(tb, 64, B, &[1, 2, 3])).await
    ));
    assert_eq!(server.stats().index_errors, 1);
    server.shutdown().await;
}

#[tokio::test]
async fn a_panicking_index_is_store_unavailable_and_the_server_keeps_serving() {
    let (server, _dir) = start_with(
        Transport::Ipc,
        ServerConfig::new(B, KeyLayout::new("m")),
        Arc::new(PanickingIndex),
    );
    let mut req = Req::connect(&tmq::Context::new(), server.local_endpoint());
    let tb = Format::TaggedBlob;
    assert!(store_unavailable(
        tb,
        &req.call(&lookup(tb, 64, B, &[1, 2, 3])).await
    ));
    let reply = req.call(&wire::encode_reset(tb).unwrap()).await;
    assert_eq!(wire::decode_reset_reply(&reply), Ok(false));
    assert!(store_unavailable(
        tb,
        &req.call(&lookup(tb, 64, B, &[1, 2, 3])).await
    ));
    let stats = server.stats();
    assert_eq!(stats.index_errors, 2);
    assert_eq!(stats.reset_failures, 1);
    assert_eq!(stats.replies, 3);
    server.shutdown().await;
}

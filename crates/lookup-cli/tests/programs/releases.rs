//! `lookup doctor` against the masters of the other Mooncake releases users run
//! (0.3.10 and 0.3.14 by default, `$MOONCAKE_RELEASES` otherwise; unpacked by
//! `scripts/mooncake/install.sh`), started with a 5 s lease, blocks written by a real
//! Python client: a probe counts the keys it asks once; with the first block stored every check passes and the `ttl` check
//! goes by the lease the master reported; with it absent the `keys` and `ttl` lines
//! agree that it is not stored.

use lookup_core::BlockHashes;
use lookup_tests::mooncake::release::other_versions;
use lookup_tests::mooncake::{Master, Release, Writer};

use super::master::lookup;

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|w| (*w).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reads_every_releases_lease_and_never_contradicts_itself() {
    let layout = lookup_server::KeyLayout::new("Qwen3-8B")
        .with_namespaces(lookup_server::RankNamespace::grid(2, 1))
        .expect("namespaces");
    let ids = [961u64, 962, 963];
    let hashes = ids
        .iter()
        .map(|id| format!("{id:016x}"))
        .collect::<Vec<_>>()
        .join(",");
    for version in other_versions() {
        let release = Release::get(&version);
        let master = Master::start_release(&release, &["-default_kv_lease_ttl=5000".to_owned()]);
        let mut writer = Writer::start_for(&master, &release);
        let doctor = |hashes: &str| {
            let mut out = words(&["doctor", "--mooncake-master", &master.addr()]);
            out.extend(words(&["--model", "Qwen3-8B", "--tp-size", "2"]));
            out.extend(words(&["--num-tokens", "49", "--hashes", hashes]));
            out
        };
        // Nothing stored yet. A probe of 2 blocks asks their 4 keys once, though a
        // master before 0.3.12 refuses the first form it is sent.
        let mut probe = words(&["probe", "--mooncake-master", &master.addr()]);
        probe.extend(words(&["--model", "Qwen3-8B", "--tp-size", "2"]));
        probe.extend(words(&["--num-tokens", "40", "--hashes", &hashes]));
        let out = lookup(probe).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{version}: {stdout}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines[..3],
            ["hit_tokens: 0", "outcome: miss", "keys_asked: 4"],
            "{version}"
        );
        // The keys check warns, and the ttl check says why it goes
        // by --lease-ttl-s in the same terms.
        let out = lookup(doctor(&hashes)).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{version}: {stdout}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("warn keys: no key of the first block")),
            "{version}: {stdout}"
        );
        assert!(
            lines.contains(
                &"ok ttl: lookup_prefetch_ttl_s 2 s is below the store's read lease 10 s \
                  (from --lease-ttl-s; the master reports its lease only for a key that \
                  exists, and the first block's first key is not stored)"
            ),
            "{version}: {stdout}"
        );
        assert_eq!(
            lines.last(),
            Some(&"doctor: 4 ok, 1 warn, 0 fail"),
            "{version}"
        );

        writer.put(&layout.chain_keys(&BlockHashes::from_u64s(&ids), 3));
        let out = lookup(doctor(&hashes)).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{version}: {stdout}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert!(
            lines.iter().any(|l| l
                .starts_with("ok reachability: the Mooncake master at 127.0.0.1:")
                && l.contains(" serves, version 2.0.0 ")),
            "{version}: {stdout}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("ok wire: BatchExistKey answered in ")
                    && l.ends_with(": hit_tokens 48 of 49 (hit)")),
            "{version}: {stdout}"
        );
        assert!(
            lines.contains(
                &"ok keys: the first block is stored under the configured layout (2 of 2 \
                  namespace keys, prefix Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@)"
            ),
            "{version}: {stdout}"
        );
        assert!(
            lines.contains(
                &"ok ttl: lookup_prefetch_ttl_s 2 s is below the store's read lease 5 s \
                  (reported by the master)"
            ),
            "{version}: {stdout}"
        );
        assert_eq!(
            lines.last(),
            Some(&"doctor: 5 ok, 0 warn, 0 fail"),
            "{version}"
        );
    }
}

//! Structure-aware fuzzer of the send stream decoder
//! (`birch::format::send_stream`, docs/SEND.md "Bad input"): each case
//! builds a random valid stream (every command of version 1 with random
//! paths, names, offsets, times and data), checks that it decodes to the
//! commands it was encoded from, then breaks it in one structured way — a
//! command's code, length or crc; an attribute's code, length or value
//! (a path with `..`, an absolute path, a short integer, nanoseconds past a
//! second); an attribute dropped or doubled; the stream truncated or a
//! byte flipped — recomputing the crc unless the crc is the target, so the
//! mutation reaches the attribute checks. The broken stream must decode
//! to an error naming a command and an offset inside the stream, or (when
//! the mutation happened to keep it valid) to commands; never a panic.
//!
//! Replay and long runs (README, "Long modes"):
//! - `BIRCH_FUZZ_SEED=S` (default: a fixed seed) and `BIRCH_FUZZ_CASES=N`
//!   (default 3000) run cases 0..N of seed S; a failure prints both, and
//!   `BIRCH_FUZZ_CASE=I` runs case I alone.
//! - `BIRCH_FUZZ_SECONDS=T` keeps running cases until T seconds have passed.

use birch::format::send_stream::{
    attr, cmd, Command, StreamPath, StreamReader, StreamTime, StreamWriter, COMMAND_HEADER_SIZE,
    MAX_COMMAND_SIZE, STREAM_HEADER_SIZE,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

const DEFAULT_SEED: u64 = 0x7365_6e64_5f66_7a00;
const DEFAULT_CASES: u64 = 3000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

fn random_component(rng: &mut ChaCha8Rng) -> Vec<u8> {
    const NAMES: &[&str] = &[
        "a",
        "b",
        "dir",
        "o257-7-0",
        "..a",
        "x.y",
        "long_name_0123456789",
    ];
    if rng.gen_bool(0.8) {
        NAMES[rng.gen_range(0..NAMES.len())].as_bytes().to_vec()
    } else {
        let name: Vec<u8> = (0..rng.gen_range(1..40))
            .map(|_| rng.gen_range(1u8..=255))
            .map(|b| if b == b'/' { b'_' } else { b })
            .collect();
        if name == b"." || name == b".." {
            b"dots".to_vec()
        } else {
            name
        }
    }
}

fn random_path(rng: &mut ChaCha8Rng, allow_root: bool) -> StreamPath {
    let depth = rng.gen_range(usize::from(!allow_root)..4);
    let parts: Vec<Vec<u8>> = (0..depth).map(|_| random_component(rng)).collect();
    let bytes = parts.join(&b'/');
    StreamPath::new(&bytes).expect("a generated path is valid")
}

fn random_name(rng: &mut ChaCha8Rng) -> StreamPath {
    StreamPath::new(&random_component(rng)).expect("a component is a valid name")
}

fn random_time(rng: &mut ChaCha8Rng) -> StreamTime {
    StreamTime {
        sec: rng.gen(),
        nsec: rng.gen_range(0..1_000_000_000),
    }
}

fn random_bytes(rng: &mut ChaCha8Rng, max: usize) -> Vec<u8> {
    let len = if rng.gen_bool(0.05) {
        max
    } else {
        rng.gen_range(0..=max.min(300))
    };
    (0..len).map(|_| rng.gen()).collect()
}

/// One valid command of a random kind.
fn random_command(rng: &mut ChaCha8Rng) -> Command {
    let code = rng.gen_range(cmd::SUBVOL..=cmd::UPDATE_EXTENT);
    let p = random_path(rng, true);
    match code {
        cmd::SUBVOL => Command::Subvol {
            path: random_name(rng),
            uuid: rng.gen(),
            ctransid: rng.gen(),
        },
        cmd::SNAPSHOT => Command::Snapshot {
            path: random_name(rng),
            uuid: rng.gen(),
            ctransid: rng.gen(),
            clone_uuid: rng.gen(),
            clone_ctransid: rng.gen(),
        },
        cmd::MKFILE => Command::Mkfile {
            path: p,
            ino: rng.gen(),
        },
        cmd::MKDIR => Command::Mkdir {
            path: p,
            ino: rng.gen(),
        },
        cmd::MKNOD => Command::Mknod {
            path: p,
            ino: rng.gen(),
            mode: rng.gen(),
            rdev: rng.gen(),
        },
        cmd::MKFIFO => Command::Mkfifo {
            path: p,
            ino: rng.gen(),
        },
        cmd::MKSOCK => Command::Mksock {
            path: p,
            ino: rng.gen(),
        },
        cmd::SYMLINK => Command::Symlink {
            path: p,
            ino: rng.gen(),
            target: {
                let mut t = random_bytes(rng, 200);
                t.retain(|&b| b != 0);
                t.push(b'x');
                t
            },
        },
        cmd::RENAME => Command::Rename {
            from: p,
            to: random_path(rng, false),
        },
        cmd::LINK => Command::Link {
            path: p,
            existing: random_path(rng, false),
        },
        cmd::UNLINK => Command::Unlink { path: p },
        cmd::RMDIR => Command::Rmdir { path: p },
        cmd::SET_XATTR => Command::SetXattr {
            path: p,
            name: random_component(rng),
            data: random_bytes(rng, 4000),
        },
        cmd::REMOVE_XATTR => Command::RemoveXattr {
            path: p,
            name: random_component(rng),
        },
        cmd::WRITE => Command::Write {
            path: p,
            offset: rng.gen(),
            data: random_bytes(rng, 48 * 1024),
        },
        cmd::CLONE => Command::Clone {
            path: p,
            offset: rng.gen(),
            len: rng.gen(),
            clone_uuid: rng.gen(),
            clone_ctransid: rng.gen(),
            clone_path: random_path(rng, false),
            clone_offset: rng.gen(),
        },
        cmd::TRUNCATE => Command::Truncate {
            path: p,
            size: rng.gen(),
        },
        cmd::CHMOD => Command::Chmod {
            path: p,
            mode: rng.gen(),
        },
        cmd::CHOWN => Command::Chown {
            path: p,
            uid: rng.gen(),
            gid: rng.gen(),
        },
        cmd::UTIMES => Command::Utimes {
            path: p,
            atime: random_time(rng),
            mtime: random_time(rng),
            ctime: random_time(rng),
        },
        cmd::UPDATE_EXTENT => Command::UpdateExtent {
            path: p,
            offset: rng.gen(),
            size: rng.gen(),
        },
        _ => Command::End,
    }
}

/// A command as the fuzzer edits it: code and attributes.
#[derive(Clone)]
struct RawCommand {
    code: u16,
    attrs: Vec<(u16, Vec<u8>)>,
    /// Whether to write a crc that does not match.
    bad_crc: bool,
    /// A length field that lies (the bytes stay as they are).
    length_override: Option<u32>,
    /// An attribute (by index) whose length field lies.
    attr_length_override: Option<(usize, u16)>,
}

impl RawCommand {
    fn from_command(c: &Command) -> Self {
        let bytes = c.encode().expect("a generated command fits");
        let mut attrs = Vec::new();
        let mut rest = &bytes[COMMAND_HEADER_SIZE..];
        while !rest.is_empty() {
            let code = u16::from_le_bytes([rest[0], rest[1]]);
            let len = usize::from(u16::from_le_bytes([rest[2], rest[3]]));
            attrs.push((code, rest[4..4 + len].to_vec()));
            rest = &rest[4 + len..];
        }
        RawCommand {
            code: c.code(),
            attrs,
            bad_crc: false,
            length_override: None,
            attr_length_override: None,
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; COMMAND_HEADER_SIZE];
        for (i, (code, value)) in self.attrs.iter().enumerate() {
            let len = match self.attr_length_override {
                Some((at, len)) if at == i => len,
                _ => value.len() as u16,
            };
            out.extend_from_slice(&code.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(value);
        }
        let len = (out.len() - COMMAND_HEADER_SIZE) as u32;
        out[0..4].copy_from_slice(&self.length_override.unwrap_or(len).to_le_bytes());
        out[4..6].copy_from_slice(&self.code.to_le_bytes());
        let crc = birch::format::send_stream::stream_crc(&out);
        let crc = if self.bad_crc { crc ^ 0x8000_0001 } else { crc };
        out[6..10].copy_from_slice(&crc.to_le_bytes());
        out
    }
}

const PATH_ATTRS: &[u16] = &[attr::PATH, attr::PATH_TO, attr::CLONE_PATH];
const HOSTILE_PATHS: &[&[u8]] = &[
    b"/etc/passwd",
    b"..",
    b"a/../../b",
    b"a//b",
    b"./a",
    b"a/",
    b"a\0b",
    b"",
];

/// Breaks one command of `raws` in one way; returns what it did.
fn mutate(rng: &mut ChaCha8Rng, raws: &mut [RawCommand]) -> String {
    let i = rng.gen_range(0..raws.len());
    let raw = &mut raws[i];
    let n = raw.attrs.len();
    match rng.gen_range(0..11) {
        0 => {
            raw.code = [0, 23, 24, 26, 99, u16::MAX][rng.gen_range(0..6)];
            format!("command {i}: code {}", raw.code)
        }
        1 => {
            raw.bad_crc = true;
            format!("command {i}: bad crc")
        }
        2 => {
            let len = [0u32, 1, 3, 65_536, u32::MAX, MAX_COMMAND_SIZE as u32][rng.gen_range(0..6)];
            raw.length_override = Some(len);
            format!("command {i}: length {len}")
        }
        3 if n > 0 => {
            let a = rng.gen_range(0..n);
            raw.attrs.remove(a);
            format!("command {i}: attribute {a} dropped")
        }
        4 if n > 0 => {
            let a = rng.gen_range(0..n);
            let dup = raw.attrs[a].clone();
            raw.attrs.push(dup);
            format!("command {i}: attribute {a} doubled")
        }
        5 if n > 0 => {
            let a = rng.gen_range(0..n);
            raw.attrs[a].0 = [0, 25, 26, 1000, u16::MAX, rng.gen()][rng.gen_range(0..6)];
            format!("command {i}: attribute {a} code {}", raw.attrs[a].0)
        }
        6 if n > 0 => {
            let a = rng.gen_range(0..n);
            let v = &mut raw.attrs[a].1;
            let len = rng.gen_range(0..v.len() + 3);
            v.resize(len, 0x2e);
            format!("command {i}: attribute {a} resized to {len}")
        }
        7 => {
            let Some(a) = raw.attrs.iter().position(|(c, _)| PATH_ATTRS.contains(c)) else {
                return "no path to break".into();
            };
            let bad = HOSTILE_PATHS[rng.gen_range(0..HOSTILE_PATHS.len())];
            raw.attrs[a].1 = bad.to_vec();
            format!(
                "command {i}: attribute {a} = {:?}",
                String::from_utf8_lossy(bad)
            )
        }
        8 => {
            let Some(a) = raw.attrs.iter().position(|(c, v)| {
                [attr::ATIME, attr::MTIME, attr::CTIME].contains(c) && v.len() == 12
            }) else {
                return "no time to break".into();
            };
            raw.attrs[a].1[8..].copy_from_slice(&1_000_000_000u32.to_le_bytes());
            format!("command {i}: attribute {a} nanoseconds past a second")
        }
        9 if n > 0 => {
            let a = rng.gen_range(0..n);
            let real = raw.attrs[a].1.len() as u16;
            let len =
                [real.wrapping_add(1), real.wrapping_add(100), u16::MAX, 0][rng.gen_range(0..4)];
            raw.attr_length_override = Some((a, len));
            format!("command {i}: attribute {a} length field {len}")
        }
        _ => "none (raw bytes follow)".into(),
    }
}

fn encode_stream(raws: &[RawCommand]) -> Vec<u8> {
    let mut out = StreamWriter::new(Vec::new()).expect("a Vec").into_inner();
    for raw in raws {
        out.extend_from_slice(&raw.encode());
    }
    out
}

fn decode(bytes: &[u8]) -> Result<Vec<Command>, birch::format::send_stream::StreamError> {
    let mut reader = StreamReader::new(bytes)?;
    let mut out = Vec::new();
    while let Some((_, c)) = reader.next_command()? {
        out.push(c);
    }
    Ok(out)
}

/// Case `case` of `seed`; panics (caught by the caller) on a failure.
fn run_case(seed: u64, case: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let count = rng.gen_range(1..12);
    let mut commands: Vec<Command> = (0..count).map(|_| random_command(&mut rng)).collect();
    commands.push(Command::End);
    let raws: Vec<RawCommand> = commands.iter().map(RawCommand::from_command).collect();
    let good = encode_stream(&raws);
    assert_eq!(decode(&good).expect("a valid stream decodes"), commands);

    let mut broken_raws = raws.clone();
    let what = mutate(&mut rng, &mut broken_raws);
    let mut broken = encode_stream(&broken_raws);
    match rng.gen_range(0..4) {
        0 => {
            let cut = rng.gen_range(0..broken.len());
            broken.truncate(cut);
        }
        1 => {
            let at = rng.gen_range(0..broken.len());
            broken[at] ^= 1 << rng.gen_range(0..8);
        }
        _ => {}
    }
    match decode(&broken) {
        Ok(_) => {}
        Err(e) => {
            assert!(
                e.offset <= broken.len() as u64,
                "{what}: error offset {} past the stream's {} bytes: {e}",
                e.offset,
                broken.len()
            );
            assert!(
                e.offset == 0 || e.offset >= STREAM_HEADER_SIZE as u64,
                "{what}: offset {} inside the header: {e}",
                e.offset
            );
            assert!(!e.command.is_empty() && !e.what.is_empty(), "{what}: {e:?}");
        }
    }
}

#[test]
fn mutated_streams_are_refused_without_panics() {
    let seed = env_u64("BIRCH_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let cases = env_u64("BIRCH_FUZZ_CASES").unwrap_or(DEFAULT_CASES);
    let seconds = env_u64("BIRCH_FUZZ_SECONDS");
    let only = env_u64("BIRCH_FUZZ_CASE");
    let start = Instant::now();
    let mut case = only.unwrap_or(0);
    loop {
        if catch_unwind(AssertUnwindSafe(|| run_case(seed, case))).is_err() {
            panic!(
                "send stream fuzz case failed: replay with BIRCH_FUZZ_SEED={seed} BIRCH_FUZZ_CASE={case} \
                 cargo test -p birch --test send_stream_fuzz"
            );
        }
        case += 1;
        if only.is_some() {
            break;
        }
        let time_left = seconds.is_some_and(|s| start.elapsed() < Duration::from_secs(s));
        if case >= cases && !time_left {
            break;
        }
    }
    println!("send stream fuzz: seed {seed}, {case} cases");
}

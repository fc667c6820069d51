//! `birch receive [-f FILE] [--image IMAGE] DIR` (docs/SEND.md "Design:
//! receive"): applies a btrfs send stream (version 1) the way btrfs-progs'
//! receive does. One receiver reads the stream and keeps its rules: each
//! subvolume is built under a hidden name and published at END (received
//! uuid set, read-only, renamed to its name), an incremental stream finds
//! its parent by received uuid and transid, a failed stream leaves
//! nothing visible, and every error names the command and its byte
//! offset. Two backends apply the commands: system calls and ioctls on a
//! birch mount ([`mounted`]), or the library on an unmounted image
//! ([`image`]).

mod image;
mod mounted;

use crate::Failure;
use birch::format::send_stream::{command_name, Command, StreamPath, StreamReader};
use birch_fuse::subvol::SubvolEntry;
use clap::Args;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;

#[derive(Args)]
pub struct ReceiveArgs {
    /// Read the stream from FILE instead of standard input
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Receive into the unmounted image IMAGE; DIR is then a directory
    /// path from its top level ("/" for the top level itself)
    #[arg(long = "image", value_name = "IMAGE")]
    image: Option<PathBuf>,
    /// The directory to create the received subvolumes in: on a birch
    /// mount, or with --image inside the image
    dir: PathBuf,
}

/// The prefix of the name a subvolume is received under until END.
const HIDDEN_PREFIX: &str = ".birch-receive.";

/// Where the commands of a stream apply: DIR on a birch mount, or DIR
/// inside an unmounted image. The receiver decides what happens; a
/// backend only does it, and names what it touched in its errors.
trait Backend {
    /// DIR/NAME as the user knows it, for messages.
    fn show(&self, name: &[u8]) -> String;
    /// Whether DIR holds NAME.
    fn exists(&self, name: &[u8]) -> Result<bool, String>;
    /// Every subvolume of the filesystem, as `birch subvolume list`.
    fn subvolumes(&self) -> Result<Vec<SubvolEntry>, String>;
    /// Creates the empty subvolume DIR/HIDDEN; the commands that follow
    /// apply in it.
    fn create_subvolume(&mut self, hidden: &[u8]) -> Result<(), String>;
    /// Creates DIR/HIDDEN, a writable snapshot of `source`; the commands
    /// that follow apply in it.
    fn create_snapshot(&mut self, source: &SubvolEntry, hidden: &[u8]) -> Result<(), String>;
    /// One command that changes files of the subvolume being received:
    /// any but SUBVOL, SNAPSHOT, CLONE and END.
    fn apply(&mut self, command: Command) -> Result<(), String>;
    /// CLONE: `len` bytes of `source_path` at `source_offset` into `path`
    /// at `offset`, shared where the filesystem can (a reflink). The
    /// source is in `source`, or in the subvolume being received for
    /// `None`; its atime stays as received.
    fn clone_range(
        &mut self,
        clone: &CloneArgs,
        source: Option<&SubvolEntry>,
    ) -> Result<(), String>;
    /// END: sets the received uuid and stransid of DIR/HIDDEN, makes it
    /// read-only and renames it to DIR/NAME.
    fn publish(
        &mut self,
        hidden: &[u8],
        name: &[u8],
        uuid: &[u8; 16],
        ctransid: u64,
    ) -> Result<(), String>;
    /// Deletes DIR/HIDDEN, left half-received by a failed stream.
    fn delete(&mut self, hidden: &[u8]) -> Result<(), String>;
    /// After the stream, also a failed one: makes what was published
    /// durable.
    fn finish(self) -> Result<(), String>;
}

/// CLONE's attributes but the source subvolume's.
struct CloneArgs {
    path: StreamPath,
    offset: u64,
    len: u64,
    source_path: StreamPath,
    source_offset: u64,
}

/// The subvolume being received.
struct Current {
    /// Its name in the stream (SUBVOL's or SNAPSHOT's PATH).
    name: Vec<u8>,
    uuid: [u8; 16],
    ctransid: u64,
}

struct Receiver<B: Backend> {
    backend: B,
    current: Option<Current>,
}

pub fn receive(args: &ReceiveArgs) -> Result<u8, Failure> {
    let input: Box<dyn Read> = match &args.file {
        Some(path) => {
            Box::new(io::BufReader::new(File::open(path).map_err(|e| {
                Failure::new(format!("cannot open {}: {e}", path.display()))
            })?))
        }
        None => Box::new(io::BufReader::new(io::stdin().lock())),
    };
    match &args.image {
        Some(image) => run(image::ImageBackend::open(image, &args.dir)?, input),
        None => run(mounted::MountBackend::open(&args.dir)?, input),
    }
}

/// Applies the whole stream; on failure deletes the subvolume it was
/// receiving. Subvolumes published before the failure stay, as with
/// btrfs-progs.
fn run<B: Backend>(backend: B, input: Box<dyn Read>) -> Result<u8, Failure> {
    let mut receiver = Receiver {
        backend,
        current: None,
    };
    let result = receiver.run(input);
    if result.is_err() {
        receiver.abandon();
    }
    let finished = receiver.backend.finish().map_err(Failure::new);
    result.and(finished).map(|()| 0)
}

impl<B: Backend> Receiver<B> {
    fn run(&mut self, input: Box<dyn Read>) -> Result<(), Failure> {
        let mut reader = StreamReader::new(input).map_err(|e| Failure::new(e.to_string()))?;
        while let Some((offset, command)) = reader
            .next_command()
            .map_err(|e| Failure::new(e.to_string()))?
        {
            let name = command_name(command.code());
            self.apply(command)
                .map_err(|e| Failure::new(format!("send stream: {name} at byte {offset}: {e}")))?;
        }
        if let Some(current) = &self.current {
            return Err(Failure::new(format!(
                "send stream: ends at byte {} before the END of subvolume {:?}",
                reader.offset(),
                String::from_utf8_lossy(&current.name)
            )));
        }
        Ok(())
    }

    /// Deletes a subvolume left half-received by a failed stream.
    fn abandon(&mut self) {
        if let Some(current) = self.current.take() {
            let hidden = hidden_name(&current.uuid);
            if let Err(e) = self.backend.delete(&hidden) {
                eprintln!(
                    "birch receive: could not delete the partly received {}: {e}",
                    self.backend.show(&hidden)
                );
            }
        }
    }

    fn apply(&mut self, command: Command) -> Result<(), String> {
        match command {
            Command::Subvol {
                path,
                uuid,
                ctransid,
            } => {
                self.finish_previous()?;
                let hidden = self.begin(&path, uuid, ctransid)?;
                if let Err(e) = self.backend.create_subvolume(&hidden) {
                    self.current = None;
                    return Err(e);
                }
                writeln!(io::stdout(), "At subvol {path}").map_err(|e| e.to_string())?;
            }
            Command::Snapshot {
                path,
                uuid,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => {
                self.finish_previous()?;
                let source = self.find_subvolume(&clone_uuid, clone_ctransid)?;
                let hidden = self.begin(&path, uuid, ctransid)?;
                if let Err(e) = self.backend.create_snapshot(&source, &hidden) {
                    self.current = None;
                    return Err(e);
                }
                writeln!(io::stdout(), "At snapshot {path}").map_err(|e| e.to_string())?;
            }
            Command::Clone {
                path,
                offset,
                len,
                clone_uuid,
                clone_ctransid,
                clone_path,
                clone_offset,
            } => {
                let current = self.current()?;
                let source = if current.uuid == clone_uuid {
                    None
                } else {
                    Some(self.find_subvolume(&clone_uuid, clone_ctransid)?)
                };
                let clone = CloneArgs {
                    path,
                    offset,
                    len,
                    source_path: clone_path,
                    source_offset: clone_offset,
                };
                self.backend.clone_range(&clone, source.as_ref())?;
            }
            Command::End => self.finish()?,
            command => {
                self.current()?;
                self.backend.apply(command)?;
            }
        }
        Ok(())
    }

    fn current(&self) -> Result<&Current, String> {
        self.current
            .as_ref()
            .ok_or_else(|| "no SUBVOL or SNAPSHOT before it".to_string())
    }

    /// A stream of several subvolumes (`send A B`) has one END, after the
    /// last: a SUBVOL or SNAPSHOT publishes the subvolume before it, as
    /// btrfs-progs does (its parent may be that one).
    fn finish_previous(&mut self) -> Result<(), String> {
        if self.current.is_some() {
            self.finish()?;
        }
        Ok(())
    }

    /// Starts receiving subvolume `name`; returns its hidden name.
    fn begin(
        &mut self,
        name: &StreamPath,
        uuid: [u8; 16],
        ctransid: u64,
    ) -> Result<Vec<u8>, String> {
        let name = name.as_bytes();
        if name.is_empty() || name.contains(&b'/') {
            return Err(format!(
                "subvolume name {:?} is not one name",
                String::from_utf8_lossy(name)
            ));
        }
        if self.backend.exists(name)? {
            return Err(format!(
                "target path already exists: {}",
                self.backend.show(name)
            ));
        }
        let hidden = hidden_name(&uuid);
        if self.backend.exists(&hidden)? {
            return Err(format!(
                "{} exists: left by a receive that did not finish; delete it first",
                self.backend.show(&hidden)
            ));
        }
        self.current = Some(Current {
            name: name.to_vec(),
            uuid,
            ctransid,
        });
        Ok(hidden)
    }

    /// The subvolume received as (or, failing that, sent with) `uuid` at
    /// `ctransid`: btrfs-progs' search by received uuid (matching its
    /// stransid), then by uuid (matching its ctransid). A subvolume with
    /// that uuid whose transid differs has changed since the stream's
    /// sender saw it (made writable and written, or another one received
    /// under the same uuid): applying a stream on top of it would build
    /// something the sender never had, so it is refused by name.
    fn find_subvolume(&self, uuid: &[u8; 16], ctransid: u64) -> Result<SubvolEntry, String> {
        let all = self.backend.subvolumes()?;
        let by_received = || all.iter().filter(|e| &e.received_uuid == uuid);
        let by_uuid = || all.iter().filter(|e| &e.uuid == uuid);
        let found = by_received()
            .find(|e| e.stransid == ctransid)
            .or_else(|| by_uuid().find(|e| e.ctransid == ctransid));
        if let Some(found) = found {
            return Ok(found.clone());
        }
        let changed = by_received()
            .map(|e| (e, e.stransid))
            .chain(by_uuid().map(|e| (e, e.ctransid)))
            .next();
        Err(match changed {
            Some((e, transid)) => format!(
                "parent subvolume {} is {} at transid {transid}, the stream needs transid {ctransid}: it changed since it was sent",
                String::from_utf8_lossy(&e.path),
                crate::subvolume::uuid(uuid)
            ),
            None => format!(
                "cannot find the parent subvolume: no subvolume of this filesystem was received as (or is) {}",
                crate::subvolume::uuid(uuid)
            ),
        })
    }

    /// END: records the stream's uuid and ctransid as received, makes the
    /// subvolume read-only and publishes it under its name.
    fn finish(&mut self) -> Result<(), String> {
        let current = self
            .current
            .as_ref()
            .ok_or_else(|| "END without a SUBVOL or SNAPSHOT".to_string())?;
        let hidden = hidden_name(&current.uuid);
        self.backend
            .publish(&hidden, &current.name, &current.uuid, current.ctransid)?;
        self.current = None;
        Ok(())
    }
}

/// `.birch-receive.UUID` (32 hex digits of the stream's uuid): named by
/// the stream, not by NAME, so that any NAME up to 255 bytes can be
/// received and a retry of the same stream finds what a killed receive
/// left.
fn hidden_name(uuid: &[u8; 16]) -> Vec<u8> {
    let mut hidden = HIDDEN_PREFIX.as_bytes().to_vec();
    for b in uuid {
        hidden.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    hidden
}

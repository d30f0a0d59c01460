//! The receiving side of an NVMe/TCP queue: the byte stream read into
//! the queue's buffer and parsed, PDU by PDU (a response capsule, data for
//! a read, a ready-to-transfer for a write).

use super::*;

impl TcpQueue {
    /// Reads what the socket has into the receive buffer, keeping
    /// `rx[start..end]`; false when nothing came (or the connection ended).
    pub(super) fn fill(&mut self) -> bool {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.end == self.rx.len() || self.rx.len() - self.start < 2 * DIRECT_READ {
            self.rx.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        if self.end == self.rx.len() {
            // Full of unparsed bytes: a parse step takes some first.
            return false;
        }
        loop {
            match self.stream.read(&mut self.rx[self.end..]) {
                Ok(0) => {
                    self.fail(format!("{} closed the connection", self.addr));
                    return false;
                }
                Ok(n) => {
                    self.end += n;
                    return true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(format!("receiving from {}: {e}", self.addr));
                    return false;
                }
            }
        }
    }

    /// Ensures `n` unparsed bytes; false when they are not here yet.
    pub(super) fn have(&mut self, n: usize) -> bool {
        while self.end - self.start < n {
            if !self.fill() {
                return false;
            }
        }
        true
    }

    /// Parses the next piece of the byte stream: a command's end (its CID
    /// and status) when the piece was one.
    pub(super) fn step(&mut self) -> std::result::Result<Option<(Cid, Status)>, Stop> {
        match self.state {
            Rx::Head => self.head(),
            Rx::Data { cid, at, left, crc, last, success } => {
                let n = if self.end > self.start {
                    let n = left.min(self.end - self.start);
                    // SAFETY: `at..at + left` lies in command `cid`'s buffer
                    // (checked against its length when the header came),
                    // which its request holds until the command completes,
                    // and no one else touches during the I/O.
                    let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, n) };
                    dst.copy_from_slice(&self.rx[self.start..self.start + n]);
                    self.start += n;
                    n
                } else if left >= DIRECT_READ {
                    // SAFETY: as above.
                    let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, left) };
                    match self.stream.read(dst) {
                        Ok(0) => {
                            self.fail(format!("{} closed the connection", self.addr));
                            return Err(Stop::Idle);
                        }
                        Ok(n) => n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                            return Err(Stop::Idle)
                        }
                        Err(e) => {
                            self.fail(format!("receiving from {}: {e}", self.addr));
                            return Err(Stop::Idle);
                        }
                    }
                } else if self.fill() {
                    return Ok(None);
                } else {
                    return Err(Stop::Idle);
                };
                let crc = if self.framing.digests.data {
                    // SAFETY: the bytes just written, as above.
                    tcp::digest_append(crc, unsafe { std::slice::from_raw_parts(at as *const u8, n) })
                } else {
                    crc
                };
                self.state = if n == left {
                    Rx::Digest { cid, crc, last, success }
                } else {
                    Rx::Data { cid, at: at + n, left: left - n, crc, last, success }
                };
                Ok(None)
            }
            Rx::Digest { cid, crc, last, success } => {
                if self.framing.digests.data {
                    if !self.have(tcp::DIGEST_LEN) {
                        return Err(Stop::Idle);
                    }
                    let got = u32::from_le_bytes(self.rx[self.start..self.start + 4].try_into().expect("four bytes"));
                    self.start += tcp::DIGEST_LEN;
                    if got != crc {
                        return Err(Stop::Broken(PduError::DataDigest { ty: tcp::pdu_type::C2H_DATA, got, want: crc }));
                    }
                }
                self.state = Rx::Head;
                // SUCCESS: the command succeeded and no CapsuleResp follows.
                Ok((last && success).then_some((cid, Status::SUCCESS)))
            }
        }
    }

    /// A PDU's head, and what it starts.
    pub(super) fn head(&mut self) -> std::result::Result<Option<(Cid, Status)>, Stop> {
        if !self.have(tcp::CH_LEN) {
            return Err(Stop::Idle);
        }
        let ch = CommonHeader::parse(self.rx[self.start..self.start + tcp::CH_LEN].try_into().expect("eight bytes"));
        ch.pdu_len(u32::MAX).map_err(Stop::Broken)?;
        let hl = tcp::head_len(&ch);
        if hl > RX_BUF {
            return Err(Stop::Broken(PduError::Length {
                ty: ch.pdu_type,
                plen: ch.plen,
                why: format!("a header part of {hl} bytes"),
            }));
        }
        if !self.have(hl) {
            return Err(Stop::Idle);
        }
        let head =
            tcp::parse_head(&self.rx[self.start..self.start + hl], self.framing.digests).map_err(Stop::Broken)?;
        self.start += hl;
        match head {
            Head::CapsuleResp(cqe) => Ok(Some((Cid(cqe.cid), cqe.status()))),
            Head::C2HData { cccid, datao, datal, last, success } => {
                let cid = Cid(cccid);
                let Some(e) = self.tracker.get_mut(cid) else {
                    return Err(Stop::Broken(PduError::Field(format!(
                        "C2HData for command {cccid:#06x}, which is not in flight"
                    ))));
                };
                let t = &mut e.extra;
                let end = datao as u64 + datal as u64;
                if t.dir != Dir::In || end > t.len as u64 {
                    return Err(Stop::Broken(PduError::Field(format!(
                        "C2HData of {datal} bytes at {datao} for command {cccid:#06x} of {} bytes {}",
                        t.len,
                        if t.dir == Dir::In { "to read" } else { "that reads nothing" }
                    ))));
                }
                // A command's data comes in order, each byte once: a PDU
                // that starts anywhere but where the last one ended would
                // leave bytes unwritten (or written twice) behind a success.
                // LAST_PDU ends the data: with bytes missing, it is wrong.
                if datao != t.got || (last && end != t.len as u64) {
                    return Err(Stop::Broken(PduError::Field(format!(
                        "C2HData of {datal} bytes at {datao}{} for command {cccid:#06x}, whose next byte due is {} of {}",
                        if last { " marked last" } else { "" },
                        t.got,
                        t.len
                    ))));
                }
                t.got = end as u32;
                let at = t.addr + datao as usize;
                self.state = Rx::Data { cid, at, left: datal as usize, crc: 0, last, success };
                Ok(None)
            }
            Head::R2T { cccid, ttag, r2to, r2tl } => {
                self.r2t(Cid(cccid), ttag, r2to, r2tl).map_err(Stop::Broken)?;
                Ok(None)
            }
            Head::TermReq { fes, fei } => {
                self.fail(format!("{} ended the connection (FES {fes:#x}, FEI {fei:#x})", self.addr));
                Err(Stop::Idle)
            }
        }
    }

    /// Answers an R2T: the bytes asked for, as H2CData PDUs of at most
    /// MAXH2CDATA each.
    pub(super) fn r2t(&mut self, cid: Cid, ttag: u16, r2to: u32, r2tl: u32) -> std::result::Result<(), PduError> {
        let Some(e) = self.tracker.get_mut(cid) else {
            return Err(PduError::Field(format!("R2T for command {:#06x}, which is not in flight", cid.0)));
        };
        let t = e.extra;
        let end = r2to as u64 + r2tl as u64;
        if t.dir != Dir::Out || (t.len as usize) <= self.in_capsule || r2tl == 0 || end > t.len as u64 {
            return Err(PduError::Field(format!(
                "R2T for {r2tl} bytes at {r2to} of command {:#06x}, which has {} bytes to send{}",
                cid.0,
                if t.dir == Dir::Out { t.len } else { 0 },
                if (t.len as usize) <= self.in_capsule && t.dir == Dir::Out { " in its capsule" } else { "" }
            )));
        }
        // Each byte is asked for once (R2Ts go forward, as Linux's host
        // also insists), and one R2T at a time: the host offered MAXR2T 0,
        // so an R2T before the last one's answer left is over the limit.
        // Together they bound what a command stages to its own length.
        if r2to < t.asked {
            return Err(PduError::Field(format!(
                "R2T for {r2tl} bytes at {r2to} of command {:#06x}, whose first {} bytes were asked for already",
                cid.0, t.asked
            )));
        }
        if t.r2t_until > self.flushed {
            return Err(PduError::Field(format!(
                "R2T for command {:#06x} while the answer to its last R2T is still being sent (MAXR2T 0: one at a time)",
                cid.0
            )));
        }
        let mut off = r2to;
        while off < end as u32 {
            let n = (end as u32 - off).min(self.maxh2cdata);
            // SAFETY: within the command's buffer (checked above), held by
            // its request until the command completes.
            let data = unsafe { std::slice::from_raw_parts((t.addr + off as usize) as *const u8, n as usize) };
            tcp::h2c_data(&mut self.out, cid.0, ttag, off, data, off + n == end as u32, self.framing);
            off += n;
        }
        let until = self.flushed + (self.out.len() - self.sent) as u64;
        let t = &mut self.tracker.get_mut(cid).expect("looked up above").extra;
        (t.asked, t.r2t_until) = (end as u32, until);
        Ok(())
    }
}

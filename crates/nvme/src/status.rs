//! Completion status (section 4.6.1): kept as data, named as the spec names it.

use std::fmt;

/// Status Code Type values.
pub mod sct {
    /// Generic Command Status.
    pub const GENERIC: u8 = 0;
    /// Command Specific Status.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and Data Integrity Errors.
    pub const MEDIA: u8 = 2;
    /// Path Related Status.
    pub const PATH: u8 = 3;
    /// Vendor Specific.
    pub const VENDOR: u8 = 7;
}

/// Generic status codes used by this crate's users (figure 94, and the NVM
/// command set's figure 84).
pub mod generic {
    /// Successful Completion.
    pub const SUCCESS: u8 = 0x00;
    /// Invalid Command Opcode.
    pub const INVALID_OPCODE: u8 = 0x01;
    /// Invalid Field in Command.
    pub const INVALID_FIELD: u8 = 0x02;
    /// Command ID Conflict.
    pub const CID_CONFLICT: u8 = 0x03;
    /// Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: u8 = 0x04;
    /// Internal Error.
    pub const INTERNAL_ERROR: u8 = 0x06;
    /// Command Abort Requested.
    pub const ABORT_REQUESTED: u8 = 0x07;
    /// Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: u8 = 0x08;
    /// Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: u8 = 0x0b;
    /// Command Sequence Error.
    pub const COMMAND_SEQUENCE_ERROR: u8 = 0x0c;
    /// Invalid SGL Segment Descriptor.
    pub const INVALID_SGL_SEGMENT: u8 = 0x0d;
    /// Invalid Number of SGL Descriptors.
    pub const INVALID_SGL_COUNT: u8 = 0x0e;
    /// Data SGL Length Invalid.
    pub const INVALID_SGL_LENGTH: u8 = 0x0f;
    /// SGL Descriptor Type Invalid.
    pub const INVALID_SGL_TYPE: u8 = 0x11;
    /// PRP Offset Invalid.
    pub const INVALID_PRP_OFFSET: u8 = 0x13;
    /// Namespace is Write Protected.
    pub const NAMESPACE_WRITE_PROTECTED: u8 = 0x20;
    /// Transient Transport Error (a fabrics transport lost the command).
    pub const TRANSIENT_TRANSPORT_ERROR: u8 = 0x22;
    /// LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: u8 = 0x80;
    /// Capacity Exceeded.
    pub const CAPACITY_EXCEEDED: u8 = 0x81;
}

/// Command specific status codes (figure 95 and the admin commands' sections).
pub mod command_specific {
    /// Completion Queue Invalid.
    pub const INVALID_CQ: u8 = 0x00;
    /// Invalid Queue Identifier.
    pub const INVALID_QID: u8 = 0x01;
    /// Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: u8 = 0x02;
    /// Abort Command Limit Exceeded.
    pub const ABORT_LIMIT: u8 = 0x03;
    /// Invalid Interrupt Vector.
    pub const INVALID_INTERRUPT_VECTOR: u8 = 0x08;
    /// Invalid Log Page.
    pub const INVALID_LOG_PAGE: u8 = 0x09;
    /// Invalid Queue Deletion.
    pub const INVALID_QUEUE_DELETION: u8 = 0x0c;
}

/// Media and data integrity status codes.
pub mod media {
    /// Write Fault.
    pub const WRITE_FAULT: u8 = 0x80;
    /// Unrecovered Read Error.
    pub const UNRECOVERED_READ_ERROR: u8 = 0x81;
}

/// A completion status: Status Code Type, Status Code, and the flags.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Status {
    /// Status Code Type.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Command Retry Delay.
    pub crd: u8,
    /// More: more information in the Error Information log.
    pub more: bool,
    /// Do Not Retry.
    pub dnr: bool,
}

impl Status {
    /// Successful completion.
    pub const SUCCESS: Status = Status { sct: 0, sc: 0, crd: 0, more: false, dnr: false };

    /// A status of type `sct` and code `sc`, with DNR set.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status { sct, sc, crd: 0, more: false, dnr: true }
    }

    /// A generic command status with DNR set.
    pub const fn generic(sc: u8) -> Status {
        Status::new(sct::GENERIC, sc)
    }

    /// A command specific status with DNR set.
    pub const fn command_specific(sc: u8) -> Status {
        Status::new(sct::COMMAND_SPECIFIC, sc)
    }

    /// Decodes the 16-bit field at CQE bytes 14-15 (phase tag ignored).
    #[inline]
    pub const fn from_field(field: u16) -> Status {
        Status {
            sc: (field >> 1) as u8,
            sct: ((field >> 9) & 7) as u8,
            crd: ((field >> 12) & 3) as u8,
            more: field & (1 << 14) != 0,
            dnr: field & (1 << 15) != 0,
        }
    }

    /// Encodes into the 16-bit field, with the phase tag `phase`.
    pub const fn to_field(self, phase: bool) -> u16 {
        phase as u16
            | (self.sc as u16) << 1
            | ((self.sct & 7) as u16) << 9
            | ((self.crd & 3) as u16) << 12
            | (self.more as u16) << 14
            | (self.dnr as u16) << 15
    }

    /// Whether the command succeeded.
    #[inline]
    pub const fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The spec's name for this status, or `None` for a code it does not name.
    pub fn name(self) -> Option<&'static str> {
        Some(match (self.sct, self.sc) {
            (0, 0x00) => "Successful Completion",
            (0, 0x01) => "Invalid Command Opcode",
            (0, 0x02) => "Invalid Field in Command",
            (0, 0x03) => "Command ID Conflict",
            (0, 0x04) => "Data Transfer Error",
            (0, 0x05) => "Commands Aborted due to Power Loss Notification",
            (0, 0x06) => "Internal Error",
            (0, 0x07) => "Command Abort Requested",
            (0, 0x08) => "Command Aborted due to SQ Deletion",
            (0, 0x09) => "Command Aborted due to Failed Fused Command",
            (0, 0x0a) => "Command Aborted due to Missing Fused Command",
            (0, 0x0b) => "Invalid Namespace or Format",
            (0, 0x0c) => "Command Sequence Error",
            (0, 0x0d) => "Invalid SGL Segment Descriptor",
            (0, 0x0e) => "Invalid Number of SGL Descriptors",
            (0, 0x0f) => "Data SGL Length Invalid",
            (0, 0x10) => "Metadata SGL Length Invalid",
            (0, 0x11) => "SGL Descriptor Type Invalid",
            (0, 0x12) => "Invalid Use of Controller Memory Buffer",
            (0, 0x13) => "PRP Offset Invalid",
            (0, 0x14) => "Atomic Write Unit Exceeded",
            (0, 0x15) => "Operation Denied",
            (0, 0x16) => "SGL Offset Invalid",
            (0, 0x18) => "Host Identifier Inconsistent Format",
            (0, 0x19) => "Keep Alive Timer Expired",
            (0, 0x1a) => "Keep Alive Timeout Invalid",
            (0, 0x1b) => "Command Aborted due to Preempt and Abort",
            (0, 0x1c) => "Sanitize Failed",
            (0, 0x1d) => "Sanitize In Progress",
            (0, 0x1e) => "SGL Data Block Granularity Invalid",
            (0, 0x1f) => "Command Not Supported for Queue in CMB",
            (0, 0x20) => "Namespace is Write Protected",
            (0, 0x21) => "Command Interrupted",
            (0, 0x22) => "Transient Transport Error",
            (0, 0x80) => "LBA Out of Range",
            (0, 0x81) => "Capacity Exceeded",
            (0, 0x82) => "Namespace Not Ready",
            (0, 0x83) => "Reservation Conflict",
            (0, 0x84) => "Format In Progress",
            (1, 0x00) => "Completion Queue Invalid",
            (1, 0x01) => "Invalid Queue Identifier",
            (1, 0x02) => "Invalid Queue Size",
            (1, 0x03) => "Abort Command Limit Exceeded",
            (1, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (1, 0x06) => "Invalid Firmware Slot",
            (1, 0x07) => "Invalid Firmware Image",
            (1, 0x08) => "Invalid Interrupt Vector",
            (1, 0x09) => "Invalid Log Page",
            (1, 0x0a) => "Invalid Format",
            (1, 0x0c) => "Invalid Queue Deletion",
            (1, 0x0d) => "Feature Identifier Not Saveable",
            (1, 0x0e) => "Feature Not Changeable",
            (1, 0x0f) => "Feature Not Namespace Specific",
            (1, 0x80) => "Conflicting Attributes",
            (1, 0x81) => "Invalid Protection Information",
            (1, 0x82) => "Attempted Write to Read Only Range",
            (2, 0x80) => "Write Fault",
            (2, 0x81) => "Unrecovered Read Error",
            (2, 0x82) => "End-to-end Guard Check Error",
            (2, 0x83) => "End-to-end Application Tag Check Error",
            (2, 0x84) => "End-to-end Reference Tag Check Error",
            (2, 0x85) => "Compare Failure",
            (2, 0x86) => "Access Denied",
            (2, 0x87) => "Deallocated or Unwritten Logical Block",
            (3, 0x00) => "Internal Path Error",
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} (sct {:#x}, sc {:#04x}", self.sct, self.sc)?,
            None => write!(f, "status sct {:#x} sc {:#04x}", self.sct, self.sc)?,
        }
        if self.dnr {
            write!(f, ", dnr")?;
        }
        if self.more {
            write!(f, ", more")?;
        }
        if self.name().is_some() {
            write!(f, ")")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_round_trips() {
        for field in [0u16, 0x8003, 0x4101, 0x0205, 0x3fff, 0xfffe] {
            let s = Status::from_field(field);
            assert_eq!(s.to_field(field & 1 != 0), field);
        }
    }

    #[test]
    fn names_are_the_specs() {
        assert_eq!(Status::generic(generic::LBA_OUT_OF_RANGE).name(), Some("LBA Out of Range"));
        assert_eq!(Status::command_specific(command_specific::INVALID_QUEUE_SIZE).name(), Some("Invalid Queue Size"));
        assert_eq!(Status::new(7, 1).name(), None);
        assert_eq!(
            Status::generic(generic::DATA_TRANSFER_ERROR).to_string(),
            "Data Transfer Error (sct 0x0, sc 0x04, dnr)"
        );
    }
}

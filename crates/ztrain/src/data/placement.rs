//! `--data-on`: whether the training set lives on the device (uploaded once, each step's
//! shuffled rows gathered there by their indices) or on the host (rows copied and uploaded
//! every step). `auto` puts it on the device when the backend is a device and the run's
//! memory plan plus the data set fit the arena's cap with a margin.

use zcompute::units::Bytes;

use crate::cli::DataOn;
use crate::error::{Result, TrainError};

/// The share of the arena's cap the plan and the data set may fill together under `auto`
/// (the plan is an estimate: the rest is the margin).
pub const MARGIN: (u64, u64) = (9, 10);

/// Device memory the data may take: the arena's cap with the margin, less the run's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRoom {
    /// The arena's cap (`--arena-cap`, else its default share of the device).
    pub cap: u64,
    /// The run's planned arena bytes without the data set (model, optimiser, activations;
    /// the estimate where the run was not planned).
    pub plan: u64,
}

impl DeviceRoom {
    /// Bytes left for the data set.
    #[must_use]
    pub fn free(&self) -> u64 {
        (self.cap / MARGIN.1 * MARGIN.0).saturating_sub(self.plan)
    }
}

/// Where the training set goes. `room`: `None` on the CPU backend (no device memory);
/// `bytes`: the data set's device bytes (features, labels, indices); `rows`/`max_rows`: its
/// samples and the most a device data set can hold. `--data-on device` that does not fit is
/// `OutOfMemory` saying how much is needed and free.
pub fn on_device(
    choice: DataOn,
    room: Option<DeviceRoom>,
    bytes: u64,
    rows: usize,
    max_rows: usize,
) -> Result<bool> {
    let fits = room.is_some_and(|r| bytes <= r.free()) && rows <= max_rows;
    match choice {
        DataOn::Host => Ok(false),
        DataOn::Auto => Ok(fits),
        DataOn::Device if rows > max_rows => Err(TrainError::Options(format!(
            "--data-on device: {rows} training samples, more than the {max_rows} a device data set can index; use --data-on host"
        ))),
        // The CPU backend's "device" is host memory: nothing to check beyond the host's.
        DataOn::Device => match room {
            Some(r) if bytes > r.free() => Err(TrainError::OutOfMemory {
                needed: format!(
                    "{} of device memory for the training set on the device, beside the plan's {}",
                    Bytes(bytes),
                    Bytes(r.plan)
                ),
                available: format!(
                    "{} is free for it ({}/{} of the arena cap {}, less the plan)",
                    Bytes(r.free()),
                    MARGIN.0,
                    MARGIN.1,
                    Bytes(r.cap)
                ),
                advice: "use --data-on host (or auto), fewer --samples, or raise --arena-cap"
                    .into(),
            }),
            _ => Ok(true),
        },
    }
}

/// Whether the validation set goes on the device too (uploaded once, evaluated there in
/// captured chunks, read back once an epoch): under `auto` and `device` when its `bytes` fit
/// the room left beside the training set (`taken`: the training set's device bytes, 0 when it
/// stays on the host); always on the CPU backend's "device" under `device` (host memory).
/// Never an error: a validation set that does not fit is evaluated from the host.
#[must_use]
pub fn validation_on_device(
    choice: DataOn,
    room: Option<DeviceRoom>,
    taken: u64,
    bytes: u64,
) -> bool {
    match (choice, room) {
        (DataOn::Host, _) => false,
        (DataOn::Device, None) => true,
        (DataOn::Auto, None) => false,
        (_, Some(r)) => bytes <= r.free().saturating_sub(taken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const ROOM: DeviceRoom = DeviceRoom {
        cap: 1000,
        plan: 400,
    };

    #[rstest]
    #[case(DataOn::Auto, Some(ROOM), 500, true)]
    #[case(DataOn::Auto, Some(ROOM), 501, false)]
    #[case(DataOn::Auto, None, 1, false)]
    #[case(DataOn::Host, Some(ROOM), 1, false)]
    #[case(DataOn::Device, Some(ROOM), 500, true)]
    #[case(DataOn::Device, None, 1 << 40, true)]
    fn the_choice_follows_the_room(
        #[case] choice: DataOn,
        #[case] room: Option<DeviceRoom>,
        #[case] bytes: u64,
        #[case] want: bool,
    ) {
        assert_eq!(on_device(choice, room, bytes, 10, 100).unwrap(), want);
    }

    #[rstest]
    #[case(DataOn::Auto, Some(ROOM), 300, 200, true)]
    #[case(DataOn::Auto, Some(ROOM), 300, 201, false)]
    #[case(DataOn::Device, Some(ROOM), 500, 1, false)]
    #[case(DataOn::Device, None, 0, 1 << 40, true)]
    #[case(DataOn::Auto, None, 0, 1, false)]
    #[case(DataOn::Host, Some(ROOM), 0, 1, false)]
    fn the_validation_set_takes_the_room_the_training_set_leaves(
        #[case] choice: DataOn,
        #[case] room: Option<DeviceRoom>,
        #[case] taken: u64,
        #[case] bytes: u64,
        #[case] want: bool,
    ) {
        assert_eq!(validation_on_device(choice, room, taken, bytes), want);
    }

    #[test]
    fn device_that_does_not_fit_says_how_much_is_needed_and_free() {
        let e = on_device(DataOn::Device, Some(ROOM), 501, 10, 100).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, TrainError::OutOfMemory { .. }), "{e:?}");
        assert!(
            text.contains("501 B") && text.contains("500 B is free"),
            "{text}"
        );
        let e = on_device(DataOn::Device, Some(ROOM), 1, 101, 100).unwrap_err();
        assert!(e.to_string().contains("more than the 100"), "{e}");
        assert!(!on_device(DataOn::Auto, Some(ROOM), 1, 101, 100).unwrap());
    }
}

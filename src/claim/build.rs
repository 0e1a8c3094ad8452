//! `ClaimSpec::build`: apart from mod.rs, so that the claims (which use mod.rs's trait)
//! and the definitions they implement do not import each other.

use super::etcd_lock::EtcdLock;
use super::etcd_semaphore::EtcdSemaphore;
use super::lock::Lock;
use super::semaphore::Semaphore;
use super::{Claim, ClaimSpec, HolderValue};

impl ClaimSpec {
    /// The claim, able to release (its stored value is not needed for that).
    pub fn build(&self) -> Box<dyn Claim> {
        match self.clone() {
            ClaimSpec::Lock { key } => Box::new(Lock::new(key, HolderValue::Given(Vec::new()))),
            ClaimSpec::Semaphore { prefix, limit } => Box::new(Semaphore {
                prefix,
                limit,
                value: HolderValue::Given(Vec::new()),
            }),
            ClaimSpec::EtcdLock { name } => {
                Box::new(EtcdLock::new(name, HolderValue::Given(Vec::new())))
            }
            ClaimSpec::EtcdSemaphore { prefix, limit } => Box::new(EtcdSemaphore::new(
                prefix,
                limit,
                HolderValue::Given(Vec::new()),
            )),
        }
    }
}

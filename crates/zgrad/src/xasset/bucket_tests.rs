//! XAsset's gradients in the data-parallel bucket plan (`grad_sync.rs`):
//! where the default plans cut XAsset's flat buffer. Here, beside the model, so that the
//! bucket plan's own module names no model.

use crate::DEFAULT_BUCKET_BYTES;
use crate::grad_sync::{BucketPlan, Sizing};

/// XAsset's default size at L blocks: its flat layout, the offset of `name`'s parameter.
fn xasset(layers: usize) -> (Vec<usize>, usize, impl Fn(&str) -> usize) {
    let config = crate::XAssetConfig {
        layers,
        ..crate::XAssetConfig::default()
    };
    let (offsets, len) = crate::optim::flat_layout(&config.shapes());
    let names = config.parameter_names();
    let at = {
        let offsets = offsets.clone();
        move |name: &str| offsets[names.iter().position(|n| n == name).expect(name)]
    };
    (offsets, len, at)
}

/// What the step waits for after backward: XAsset's gradients finish, in backward's last
/// nodes, in this order: block 0's o (before attention's backward), its qn and kn, its qkv
/// (with its input's gradient), its ln1, emb. The tapered plan (1 MiB) cuts at block 0's
/// o.weight and qkv.weight, so after qkv's node only qkv, qn, kn (197,632 elements) and then
/// ln1 and emb (50,176) are left to sum; the uniform plan also left o and ln2 to that point
/// (one bucket of 263,936). At L = 1 and 3; every element in one bucket either way.
#[rstest::rstest]
#[case::one_block(1, "")]
#[case::three_blocks(3, "blocks.0.")]
fn tapered_buckets_leave_backwards_last_nodes_little_to_sum(
    #[case] layers: usize,
    #[case] block0: &str,
) {
    let (offsets, len, at) = xasset(layers);
    let elems = DEFAULT_BUCKET_BYTES / 4;
    let qkv = at(&format!("{block0}qkv.weight"));
    let o = at(&format!("{block0}o.weight"));
    let f1 = at(&format!("{block0}f1.weight"));
    let tapered = BucketPlan::new(&offsets, len, elems, Sizing::Tapered);
    let tail = &tapered.ranges()[tapered.ranges().len() - 3..];
    assert_eq!(tail, [o..f1, qkv..o, 0..qkv], "{:?}", tapered.ranges());
    assert_eq!((qkv, o - qkv), (50_176, 197_632));
    let uniform = BucketPlan::new(&offsets, len, elems, Sizing::Uniform);
    let tail = &uniform.ranges()[uniform.ranges().len() - 2..];
    assert_eq!(tail, [qkv..f1, 0..qkv], "{:?}", uniform.ranges());
    for plan in [&tapered, &uniform] {
        let mut covered = vec![0u8; len];
        for r in plan.ranges() {
            covered[r.clone()].iter_mut().for_each(|c| *c += 1);
        }
        assert!(covered.iter().all(|&c| c == 1), "every element once");
        assert!(
            plan.ranges().iter().all(|r| r.len() <= elems + f1),
            "{:?}",
            plan.ranges()
        );
    }
}

//! Tests' tensor-parallel groups on the CPU: `size` ranks as threads of this process, joined by
//! a TCP all-reduce (rank 0 its root), each running the same closure with its [`Tp`].

use super::collective::TcpAllReduce;
use super::{AllReduce, Tp};
use std::sync::Arc;
use std::time::Duration;

/// `f(tp)` on `size` ranks; each rank's answer, in rank order. One rank has no all-reduce.
pub(crate) fn on_ranks<T: Send + 'static>(
    size: usize,
    f: impl Fn(Tp) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let listener = TcpAllReduce::listen([127, 0, 0, 1].into()).unwrap();
    let addr = listener.local_addr().unwrap();
    let f = Arc::new(f);
    let ranks: Vec<_> = (0..size)
        .map(|rank| {
            let f = f.clone();
            let listener = (rank == 0).then(|| listener.try_clone().unwrap());
            std::thread::spawn(move || {
                let reduce: Option<Arc<dyn AllReduce>> = match (size, listener) {
                    (1, _) => None,
                    (_, Some(l)) => Some(Arc::new(
                        TcpAllReduce::serve(l, size, Duration::from_secs(30)).unwrap(),
                    )),
                    (_, None) => Some(Arc::new(TcpAllReduce::connect(addr, rank).unwrap())),
                };
                f(Tp { rank, size, reduce })
            })
        })
        .collect();
    ranks.into_iter().map(|r| r.join().unwrap()).collect()
}

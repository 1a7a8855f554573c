//! The deadlock NCCL can hit through this plugin, provoked on purpose: NCCL's
//! kernel spins on the GPU until the plugin has moved its data, so nothing the
//! plugin does to move that data may wait for kernels of other streams.
//!
//! `data_path_never_waits_for_other_streams_kernels`: the device is opened and 16
//! lanes made first (the plugin does both before NCCL's kernels wait on it: at the
//! process's first connect and at regMr). Then every step of the device data path
//! runs next to a stand-in for NCCL's stream: one non-blocking stream that gets, for
//! each step, a one-warp kernel spinning on a host-mapped flag plus a second launch
//! queued behind it (NCCL's next kernel), with the legacy default stream waiting for
//! both (PyTorch's compute stream after `work.wait()`). The steps: a download on
//! every lane's stream, an upload on every lane's stream, a GPU encode on each, a GPU
//! decode on each, then allocations. A step not done within `STUCK_AFTER` waited for
//! the spinner: the spinner is released, the step recorded as stuck, and the next
//! step gets a fresh spinner, so one run tables every step (copies and kernels, each
//! lane's stream) instead of stopping at the first. Since the same stream plays NCCL
//! throughout, a lane stream that shares a hardware queue with it
//! (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default) does so in every step: stuck kernels
//! on some lanes only, with their copies fine, point there. Worth running once more
//! with `CUDA_DEVICE_MAX_CONNECTIONS=1` (Megatron's setting: one hardware queue) and
//! 32 (no sharing).
//!
//! Three more tests put the application's own hazards next to a spinning kernel
//! whose data a plugin thread must move (each fails if the plugin thread cannot
//! finish while the spinner waits for it, and names the operation it was in):
//! * `plugin_moves_data_while_another_thread_lazily_loads_a_module`: a second
//!   thread loads a fresh module and launches its kernel (CUDA_MODULE_LOADING=LAZY,
//!   the default since CUDA 12.2: the load may wait for the device to go idle);
//! * `plugin_moves_data_while_another_thread_frees`: a second thread frees device
//!   and pinned memory and destroys a stream (each may wait for the device);
//! * `plugin_moves_data_while_the_application_captures_a_graph`: a second thread
//!   captures a CUDA graph in global mode (PyTorch's default) while the plugin makes
//!   a lane (pinned and device allocations, a stream) and moves data; the plugin's
//!   calls must succeed and the capture must still end with a valid graph (the
//!   plugin's threads run the driver in relaxed capture mode).
//!
//! In each, the plugin thread moves the chunk with copies first, then with kernels,
//! so a failure says which of the two waits.
//!
//! The GPU tests of this binary run one at a time (a process-wide lock). Each step's
//! duration is printed. Prints "SKIP: <reason>" and passes without a usable GPU.
//!
//! First GPU run (bench/results/gpu-2026-11-27-h100): opening the device next to a
//! spinning kernel waited for it (the test opened it under the spinner then), and
//! the three application hazards stopped the plugin thread; which operation was not
//! recorded.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use nccl_net_zip::codec::{self, EncodeOptions};
use nccl_net_zip::gpu::pool::{pool, Dir};
use nccl_net_zip::gpu::{backend_for, DeviceBuffer, Emulation, MappedHost};

/// Spins until the 32-bit word at `flag` (host-mapped) is nonzero.
const SPIN_PTX: &str = r#"
.version 7.0
.target sm_80
.address_size 64

.visible .entry nzc_test_spin(
	.param .u64 flag
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [flag];
	cvta.to.global.u64 	%rd2, %rd1;
SPIN:
	ld.volatile.global.u32 	%r1, [%rd2];
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 bra 	SPIN;
	ret;
}
"#;

const STEP_TIMEOUT: Duration = Duration::from_secs(8);
/// How long the worker may take to finish once the spinner is released.
const AFTER_RELEASE: Duration = Duration::from_secs(30);
const LANES: usize = 16;
const CHUNK: usize = 256 << 10;

/// Device 0's primary context with the GPU lock held (so that two tests' spinners
/// never run at once), or None after printing "SKIP: <reason>".
fn context() -> Option<(Arc<CudaContext>, std::sync::MutexGuard<'static, ()>)> {
    static GPU: Mutex<()> = Mutex::new(());
    let guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    // Lazy loading is CUDA's default since 12.2; made explicit so that the lazy-load
    // hazard is provoked whatever the environment says. Read at cuInit.
    if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        std::env::set_var("CUDA_MODULE_LOADING", "LAZY");
    }
    nccl_net_zip::gpu::driver::open_context(0)
        .map_err(|u| eprintln!("SKIP: {u}"))
        .ok()
        .map(|c| (c, guard))
}

/// bf16-like values (compressible) from a seed.
fn data(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n / 2)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let e = 118 + (x % 7) as u8; // a narrow exponent range
            [(x >> 8) as u8, (e << 7) | ((x >> 16) as u8 & 0x7F)]
        })
        .collect()
}

/// Sets `finished` when the worker ends, also by a panic (the watchdog then stops
/// waiting at once instead of reporting a hang).
struct Finished<'a>(&'a AtomicBool);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

/// Ends the process (status 3) after one clear line: used where the worker is still
/// inside a CUDA call after the spinner was released. A panic would unwind through
/// this test's allocations, whose frees wait for all device work, and the binary
/// would sit until the caller's time limit. `_exit` skips atexit handlers (the CUDA
/// driver's teardown could wait as well).
fn exit_now(why: &str) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    eprintln!(
        "HAZARDS TEST STUCK: data_path_never_waits_for_other_streams_kernels, {why}; \
         exiting with status 3"
    );
    let _ = std::io::stderr().flush();
    // SAFETY: ends the process at once; nothing is shared with other processes.
    unsafe { libc::_exit(3) }
}

/// The spinning kernel (`SPIN_PTX`), loaded in a module of its own that is never
/// unloaded (an unload would wait for the device).
fn spin_function(ctx: &Arc<CudaContext>) -> cudarc::driver::CudaFunction {
    let m = ctx.load_module(Ptx::from_src(SPIN_PTX)).unwrap();
    let f = m.load_function("nzc_test_spin").unwrap();
    std::mem::forget(m);
    f
}

/// Queues `n` one-warp launches of `f` on `stream`, each spinning until the word
/// at `flag_dev` (host-mapped) is nonzero.
fn launch_spinners(
    stream: &cudarc::driver::CudaStream,
    f: &cudarc::driver::CudaFunction,
    flag_dev: u64,
    n: usize,
) {
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    for _ in 0..n {
        let mut b = stream.launch_builder(f);
        b.arg(&flag_dev);
        // SAFETY: one pointer argument, to host-mapped memory that is never freed.
        unsafe { b.launch(cfg) }.unwrap();
    }
}

/// NCCL's stream, played by one stream that gets a fresh pair of spinning kernels
/// per step (the first spins, the second is NCCL's next kernel queued behind it),
/// with the legacy default stream waiting for both (PyTorch's compute stream after
/// `work.wait()`). One stream for every step, as NCCL's stream stays the same while
/// the plugin's lane streams move its data: whether a lane's stream shares a hardware
/// queue with it (`CUDA_DEVICE_MAX_CONNECTIONS`) then stays the same across steps.
struct NcclStream {
    stream: Arc<cudarc::driver::CudaStream>,
    spin: cudarc::driver::CudaFunction,
}

impl NcclStream {
    fn new(ctx: &Arc<CudaContext>) -> NcclStream {
        NcclStream {
            spin: spin_function(ctx),
            stream: ctx.new_stream().unwrap(),
        }
    }

    /// Starts a spinning kernel and queues a second behind it; returns the flag that
    /// releases both (host-mapped, never freed: a free would wait for the spinner).
    fn spin(&self, ctx: &Arc<CudaContext>) -> ManuallyDrop<MappedHost> {
        let flag = ManuallyDrop::new(MappedHost::new(ctx, 64).unwrap());
        launch_spinners(&self.stream, &self.spin, flag.dev_ptr(), 2);
        let ev = self.stream.record_event(None).unwrap();
        // SAFETY: the legacy stream of the current (primary) context waits for the event.
        unsafe { sys::cuStreamWaitEvent(std::ptr::null_mut(), ev.cu_event(), 0) }
            .result()
            .unwrap();
        std::mem::forget(ev);
        let t0 = Instant::now();
        while !self.busy() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the spinner did not start"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(self.busy(), "the spinner is not running");
        flag
    }

    fn busy(&self) -> bool {
        // SAFETY: a plain query of a stream of this context.
        unsafe {
            sys::cuStreamQuery(self.stream.cu_stream()) == sys::CUresult::CUDA_ERROR_NOT_READY
        }
    }

    /// Releases the spinners of `flag` and waits until the stream is idle.
    fn release(&self, flag: &MappedHost) {
        // SAFETY: 4 bytes of the mapped allocation; the kernels only read it.
        unsafe { std::ptr::write_volatile(flag.host_ptr() as *mut u32, 1) };
        let t0 = Instant::now();
        while self.busy() {
            if t0.elapsed() > AFTER_RELEASE {
                exit_now("the spinning kernels did not end after their release");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// How long one step may take while the spinner runs before it counts as waiting for
/// it (a step takes microseconds to milliseconds on its own).
const STUCK_AFTER: Duration = Duration::from_secs(3);
/// After this many stuck steps the test stops trying more (each costs STUCK_AFTER).
const MAX_STUCK: usize = 6;

type Lanes = Vec<Box<dyn nccl_net_zip::gpu::Lane>>;
type Step = Box<dyn FnOnce(&mut Lanes) -> Result<(), String> + Send>;

#[test]
fn data_path_never_waits_for_other_streams_kernels() {
    let Some((ctx, _gpu)) = context() else { return };
    // SAFETY: this test uses no CudaSlice.
    unsafe { ctx.disable_event_tracking() };
    let max_wire = codec::max_compressed_size(CHUNK);
    // Device buffers, filled before any spinner (synchronous copies on the legacy
    // stream would wait for it by design).
    let srcs: Vec<u64> = (0..LANES)
        .map(|i| {
            let b = ManuallyDrop::new(DeviceBuffer::new(&ctx, CHUNK).unwrap());
            b.write(0, &data(i as u64, CHUNK)).unwrap();
            b.ptr()
        })
        .collect();
    let dsts: Vec<ManuallyDrop<DeviceBuffer>> = (0..2 * LANES)
        .map(|_| {
            let b = DeviceBuffer::new(&ctx, CHUNK).unwrap();
            b.fill(0xEE).unwrap();
            ManuallyDrop::new(b)
        })
        .collect();
    // The device is opened and the lanes made before NCCL's kernels run, as the
    // plugin does at a process's first connect and at regMr (opening the device next
    // to a running kernel waits for it: the first GPU run, bench/results/
    // gpu-2026-11-27-h100).
    static HELD: AtomicU64 = AtomicU64::new(0);
    let b = backend_for(srcs[0], Emulation::Off).expect("open the device");
    eprintln!("backend: {}", b.describe());
    let mut lanes: Lanes = (0..LANES)
        .map(|_| b.lane(max_wire, &HELD).expect("make a lane"))
        .collect();
    let kernels = lanes[0].kernels();
    let nccl = NcclStream::new(&ctx);

    // The steps, in the order that separates the causes: copies on every lane's
    // stream first, then kernels (encode, decode) on every lane's stream.
    let mut steps: Vec<(String, Step)> = Vec::new();
    for i in 0..LANES {
        let src = srcs[i];
        steps.push((
            format!("lane {i}: download (DtoH copy)"),
            Box::new(move |l: &mut Lanes| l[i].download(src, CHUNK).map_err(|e| e.to_string())),
        ));
    }
    for i in 0..LANES {
        let dst = dsts[2 * i + 1].ptr();
        steps.push((
            format!("lane {i}: upload (HtoD copy)"),
            Box::new(move |l: &mut Lanes| {
                // The staging holds the source's bytes (downloaded before any
                // spinner); the step is the upload alone.
                l[i].upload(dst, CHUNK).map_err(|e| e.to_string())
            }),
        ));
    }
    let frame_len = Arc::new(Mutex::new(vec![0usize; LANES]));
    if kernels {
        for i in 0..LANES {
            let (src, fl) = (srcs[i], frame_len.clone());
            steps.push((
                format!("lane {i}: GPU encode (kernel + copy)"),
                Box::new(move |l: &mut Lanes| {
                    let n = l[i]
                        .encode(src, CHUNK, &EncodeOptions::default())
                        .map_err(|e| e.to_string())?;
                    fl.lock().unwrap()[i] = n;
                    Ok(())
                }),
            ));
        }
        for i in 0..LANES {
            let (dst, fl) = (dsts[2 * i].ptr(), frame_len.clone());
            steps.push((
                format!("lane {i}: GPU decode (copy + kernel)"),
                Box::new(move |l: &mut Lanes| {
                    let n = fl.lock().unwrap()[i];
                    let m = l[i].decode(n, dst, CHUNK).map_err(|e| e.to_string())?;
                    if m != CHUNK {
                        return Err(format!("decoded {m} bytes, not {CHUNK}"));
                    }
                    Ok(())
                }),
            ));
        }
    } else {
        for i in 0..LANES {
            let (src, dst) = (srcs[i], dsts[2 * i].ptr());
            steps.push((
                format!("lane {i}: copies (no kernels)"),
                Box::new(move |l: &mut Lanes| {
                    l[i].download(src, CHUNK).map_err(|e| e.to_string())?;
                    l[i].upload(dst, CHUNK).map_err(|e| e.to_string())
                }),
            ));
        }
    }
    {
        let (ctx2, src0) = (ctx.clone(), srcs[0]);
        steps.push((
            "cuMemAlloc, then a download".into(),
            Box::new(move |l: &mut Lanes| {
                let d = DeviceBuffer::new(&ctx2, 1 << 20).map_err(|e| e.to_string())?;
                std::mem::forget(d); // a free would wait for the spinner
                l[0].download(src0, CHUNK).map_err(|e| e.to_string())
            }),
        ));
        let ctx3 = ctx.clone();
        steps.push((
            "cuMemHostAlloc, then a download".into(),
            Box::new(move |l: &mut Lanes| {
                let h = MappedHost::new(&ctx3, 1 << 20).map_err(|e| e.to_string())?;
                std::mem::forget(h);
                l[0].download(src0, CHUNK).map_err(|e| e.to_string())
            }),
        ));
    }
    // One worker thread holds the lanes and runs the steps it is sent (as a codec
    // worker of the plugin would); this thread starts a spinner before each step.
    let (tx, rx) = std::sync::mpsc::channel::<Step>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let worker = std::thread::spawn(move || {
        for step in rx {
            if done_tx.send(step(&mut lanes)).is_err() {
                break;
            }
        }
        std::mem::forget(lanes); // lanes live for the process, as in the plugin's pools
    });
    let mut table = Vec::new();
    let mut stuck = Vec::new();
    let mut failed = Vec::new();
    let total = steps.len();
    for (name, step) in steps {
        if stuck.len() >= MAX_STUCK {
            table.push(format!(
                "  {name:<40} NOT RUN ({MAX_STUCK} steps already stuck)"
            ));
            continue;
        }
        let flag = nccl.spin(&ctx);
        let t0 = Instant::now();
        tx.send(step).unwrap();
        let (r, under_spin) = match done_rx.recv_timeout(STUCK_AFTER) {
            Ok(r) => (r, nccl.busy()),
            Err(_) => {
                // Waiting for the spinner: release it (NCCL's kernel gets its data
                // in the end) and see whether the step then finishes.
                nccl.release(&flag);
                match done_rx.recv_timeout(AFTER_RELEASE) {
                    Ok(r) => (r, false),
                    Err(_) => exit_now(&format!(
                        "step '{name}' still stuck {AFTER_RELEASE:?} after the spinner was released"
                    )),
                }
            }
        };
        let took = t0.elapsed();
        nccl.release(&flag);
        let verdict = match (&r, under_spin) {
            (Err(e), _) => {
                failed.push(format!("{name}: {e}"));
                format!("FAILED: {e}")
            }
            (Ok(()), true) => "ok while the spinner ran".to_string(),
            (Ok(()), false) if took >= STUCK_AFTER => {
                stuck.push(name.clone());
                "STUCK until the spinner was released".to_string()
            }
            (Ok(()), false) => "ok (the spinner had ended: proves nothing)".to_string(),
        };
        table.push(format!("  {name:<40} {:>10.3?}  {verdict}", took));
    }
    drop(tx);
    worker.join().unwrap();
    eprintln!(
        "{total} steps, each next to a spinning kernel with a second queued behind it \
         (CUDA_DEVICE_MAX_CONNECTIONS={}):",
        std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").unwrap_or_else(|_| "unset".into())
    );
    for l in &table {
        eprintln!("{l}");
    }
    ctx.synchronize().unwrap();
    assert!(failed.is_empty(), "steps failed: {failed:?}");
    assert!(
        stuck.is_empty(),
        "{} step(s) waited for another stream's kernel (the plugin would deadlock NCCL \
         there): {stuck:?}",
        stuck.len()
    );
    assert!(
        table.iter().all(|l| !l.contains("proves nothing")),
        "a spinner ended before it was released: the test proved nothing"
    );
    // The data arrived intact.
    for i in 0..LANES {
        let want = data(i as u64, CHUNK);
        for d in [&dsts[2 * i], &dsts[2 * i + 1]] {
            let mut got = vec![0u8; CHUNK];
            d.read(0, &mut got).unwrap();
            assert!(got == want, "lane {i}: device data differs");
        }
    }
}

// ---- the application's hazards next to the plugin's data path -------------------

/// A trivial kernel in a module of its own, loaded by the "application" thread.
const FRESH_PTX: &str = r#"
.version 7.0
.target sm_80
.address_size 64

.visible .entry nzc_test_fresh(
	.param .u64 out
)
{
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [out];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, 7;
	st.global.u32 	[%rd2], %r1;
	ret;
}
"#;

/// NCCL's kernel, played by one warp spinning on a host-mapped flag on a stream of
/// its own. Nothing here is freed (`ManuallyDrop`): frees wait for the spinner.
struct Spinner {
    flag: ManuallyDrop<MappedHost>,
    stream: Arc<cudarc::driver::CudaStream>,
}

impl Spinner {
    fn start(ctx: &Arc<CudaContext>) -> Spinner {
        let flag = ManuallyDrop::new(MappedHost::new(ctx, 64).unwrap());
        let f = spin_function(ctx);
        let stream = ctx.new_stream().unwrap();
        launch_spinners(&stream, &f, flag.dev_ptr(), 1);
        let s = Spinner { flag, stream };
        std::thread::sleep(Duration::from_millis(200));
        assert!(s.spinning(), "the spinner is not running");
        s
    }
    fn spinning(&self) -> bool {
        // SAFETY: a plain query of a stream of this context.
        let r = unsafe { sys::cuStreamQuery(self.stream.cu_stream()) };
        r == sys::CUresult::CUDA_ERROR_NOT_READY
    }
    fn release(&self) {
        // SAFETY: 4 bytes of the mapped allocation; the kernel only reads it.
        unsafe { std::ptr::write_volatile(self.flag.host_ptr() as *mut u32, 1) };
    }
}

/// Device buffers for one plugin chunk, made before the spinner starts (and never
/// freed): a compressible source and two destinations.
struct Chunk {
    src: ManuallyDrop<DeviceBuffer>,
    dst: ManuallyDrop<DeviceBuffer>,
    dst2: ManuallyDrop<DeviceBuffer>,
}

impl Chunk {
    fn new(ctx: &Arc<CudaContext>, seed: u64) -> Chunk {
        let src = DeviceBuffer::new(ctx, CHUNK).unwrap();
        src.write(0, &data(seed, CHUNK)).unwrap();
        let mk = || {
            let b = DeviceBuffer::new(ctx, CHUNK).unwrap();
            b.fill(0xEE).unwrap();
            ManuallyDrop::new(b)
        };
        Chunk {
            src: ManuallyDrop::new(src),
            dst: mk(),
            dst2: mk(),
        }
    }
    fn check(&self, seed: u64) {
        let want = data(seed, CHUNK);
        for d in [&self.dst, &self.dst2] {
            let mut got = vec![0u8; CHUNK];
            d.read(0, &mut got).unwrap();
            assert!(got == want, "device data differs after the plugin moved it");
        }
    }
}

/// What a plugin thread does for one chunk: the pool of the device (opened, and a
/// lane made, if this is the first use: `regMr`'s work), then GPU encode + decode
/// (or copies without kernels), download and upload.
fn plugin_moves_chunk(c: &Chunk, dir: Dir, max_wire: usize) -> Result<(), String> {
    let at = |what: &'static str| *PLUGIN_AT.lock().unwrap() = what;
    at("open the device");
    let b = backend_for(c.src.ptr(), Emulation::Off).map_err(|e| format!("open: {e}"))?;
    at("make a lane (regMr's prewarm)");
    let p = pool(&b, dir, max_wire, LANES);
    p.prewarm(1).map_err(|e| format!("prewarm (regMr): {e}"))?;
    let mut lane = p.acquire(&|| false).map_err(|e| format!("acquire: {e}"))?;
    // Copies first, then kernels: a failure says which of the two waited.
    at("download (DtoH copy)");
    lane.download(c.src.ptr(), CHUNK)
        .map_err(|e| format!("download: {e}"))?;
    at("upload (HtoD copy)");
    lane.upload(c.dst2.ptr(), CHUNK)
        .map_err(|e| format!("upload: {e}"))?;
    if lane.kernels() {
        at("GPU encode (kernel)");
        let n = lane
            .encode(c.src.ptr(), CHUNK, &EncodeOptions::default())
            .map_err(|e| format!("GPU encode: {e}"))?;
        at("GPU decode (kernel)");
        let m = lane
            .decode(n, c.dst.ptr(), CHUNK)
            .map_err(|e| format!("GPU decode: {e}"))?;
        if m != CHUNK {
            return Err(format!("GPU decode gave {m} bytes, not {CHUNK}"));
        }
    } else {
        at("copies (no kernels)");
        lane.download(c.src.ptr(), CHUNK)
            .and_then(|_| lane.upload(c.dst.ptr(), CHUNK))
            .map_err(|e| format!("copies: {e}"))?;
    }
    at("done");
    Ok(())
}

/// Where `plugin_moves_chunk` is, for the failure message of a hazard test.
static PLUGIN_AT: Mutex<&str> = Mutex::new("not started");

/// Runs `app` on one thread and `plugin` on another while a spinner waits, the
/// spinner released only once `plugin` finished (NCCL's kernel gets its data), or
/// after `STEP_TIMEOUT` without it (then the test fails: the plugin would deadlock
/// NCCL next to that application behaviour). `app` may block until the spinner
/// ends; it gets `AFTER_RELEASE` after that. Returns `app`'s result.
fn next_to_spinner<A>(
    ctx: &Arc<CudaContext>,
    hazard: &str,
    app: impl FnOnce(Arc<CudaContext>) -> A + Send + 'static,
    plugin: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> A
where
    A: Send + 'static,
{
    let spin = Spinner::start(ctx);
    let app_done = Arc::new(AtomicBool::new(false));
    let app_thread = {
        let (ctx, done) = (ctx.clone(), app_done.clone());
        std::thread::spawn(move || {
            let _f = Finished(&done);
            app(ctx)
        })
    };
    // Let the application thread get into its call first.
    std::thread::sleep(Duration::from_millis(100));
    let plugin_done = Arc::new(AtomicBool::new(false));
    let plugin_thread = {
        let done = plugin_done.clone();
        std::thread::spawn(move || {
            let _f = Finished(&done);
            plugin()
        })
    };
    let t0 = Instant::now();
    while !plugin_done.load(SeqCst) && t0.elapsed() < STEP_TIMEOUT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let finished_in_time = plugin_done.load(SeqCst);
    let plugin_at = *PLUGIN_AT.lock().unwrap();
    let spinning = spin.spinning();
    spin.release();
    let t1 = Instant::now();
    while !(plugin_done.load(SeqCst) && app_done.load(SeqCst)) {
        if t1.elapsed() > AFTER_RELEASE {
            exit_now(&format!(
                "{hazard}: still stuck {AFTER_RELEASE:?} after the spinner was released (plugin thread done: {}, application thread done: {})",
                plugin_done.load(SeqCst),
                app_done.load(SeqCst)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let plugin_result = plugin_thread
        .join()
        .unwrap_or_else(|_| Err("plugin thread panicked".into()));
    let app_result = app_thread.join().expect("application thread panicked");
    spin.stream.synchronize().unwrap();
    assert!(
        finished_in_time,
        "{hazard}: the plugin thread made no progress in {STEP_TIMEOUT:?} while NCCL's kernel \
         waited for its data (it was in: {plugin_at}): a deadlock inside a real job"
    );
    if let Err(e) = plugin_result {
        panic!("{hazard}: the plugin thread failed: {e}");
    }
    assert!(
        spinning,
        "{hazard}: the spinner stopped before it was released (the test proved nothing)"
    );
    eprintln!(
        "{hazard}: plugin thread done in {:?} while the kernel spun",
        t0.elapsed()
    );
    app_result
}

#[test]
fn plugin_moves_data_while_another_thread_lazily_loads_a_module() {
    let Some((ctx, _gpu)) = context() else { return };
    // SAFETY: this test uses no CudaSlice.
    unsafe { ctx.disable_event_tracking() };
    let max_wire = codec::max_compressed_size(CHUNK);
    let chunk = Arc::new(Chunk::new(&ctx, 11));
    // The plugin's device is open and its pool warm, as after regMr.
    plugin_moves_chunk(&chunk, Dir::Send, max_wire).unwrap();
    let out = ManuallyDrop::new(DeviceBuffer::new(&ctx, 64).unwrap());
    let out_ptr = out.ptr();
    let c2 = chunk.clone();
    let loaded = next_to_spinner(
        &ctx,
        "lazy module load",
        move |ctx| -> Result<(), String> {
            // cuModuleLoadData + cuModuleGetFunction (which loads the kernel under
            // lazy loading) + a launch on a stream of its own.
            let m = ctx
                .load_module(Ptx::from_src(FRESH_PTX))
                .map_err(|e| e.to_string())?;
            let f = m
                .load_function("nzc_test_fresh")
                .map_err(|e| e.to_string())?;
            let s = ctx.new_stream().map_err(|e| e.to_string())?;
            let mut b = s.launch_builder(&f);
            b.arg(&out_ptr);
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one pointer to 64 bytes of device memory that is never freed.
            unsafe { b.launch(cfg) }.map_err(|e| e.to_string())?;
            s.synchronize().map_err(|e| e.to_string())?;
            std::mem::forget((m, s));
            Ok(())
        },
        move || plugin_moves_chunk(&c2, Dir::Send, max_wire),
    );
    loaded.expect("the application's lazy load failed");
    let mut v = [0u8; 4];
    out.read(0, &mut v).unwrap();
    assert_eq!(
        u32::from_le_bytes(v),
        7,
        "the freshly loaded kernel did not run"
    );
    chunk.check(11);
}

#[test]
fn plugin_moves_data_while_another_thread_frees() {
    let Some((ctx, _gpu)) = context() else { return };
    // SAFETY: this test uses no CudaSlice.
    unsafe { ctx.disable_event_tracking() };
    let max_wire = codec::max_compressed_size(CHUNK);
    let chunk = Arc::new(Chunk::new(&ctx, 12));
    plugin_moves_chunk(&chunk, Dir::Recv, max_wire).unwrap();
    // What the application frees while NCCL's kernel spins.
    let dev = DeviceBuffer::new(&ctx, 8 << 20).unwrap();
    let host = MappedHost::new(&ctx, 8 << 20).unwrap();
    let stream = ctx.new_stream().unwrap();
    let c2 = chunk.clone();
    next_to_spinner(
        &ctx,
        "free by another thread",
        move |_ctx| {
            drop(dev); // cuMemFree
            drop(host); // cuMemFreeHost
            drop(stream); // cuStreamDestroy
        },
        move || plugin_moves_chunk(&c2, Dir::Recv, max_wire),
    );
    chunk.check(12);
}

#[test]
fn plugin_moves_data_while_the_application_captures_a_graph() {
    let Some((ctx, _gpu)) = context() else { return };
    // SAFETY: this test uses no CudaSlice.
    unsafe { ctx.disable_event_tracking() };
    // A chunk size no other test uses: the plugin makes a new pool and lane (pinned
    // and device allocations, a stream) during the capture, as a regMr would.
    let max_wire = codec::max_compressed_size(CHUNK) + 4096;
    let chunk = Arc::new(Chunk::new(&ctx, 13));
    let out = ManuallyDrop::new(DeviceBuffer::new(&ctx, 64).unwrap());
    let out_ptr = out.ptr();
    let fresh = ctx.load_module(Ptx::from_src(FRESH_PTX)).unwrap();
    let f = fresh.load_function("nzc_test_fresh").unwrap();
    std::mem::forget(fresh);
    let capturing = Arc::new(AtomicBool::new(false));
    let plugin_finished = Arc::new(AtomicBool::new(false));
    let c2 = chunk.clone();
    let (cap2, fin2) = (capturing.clone(), plugin_finished.clone());
    let graph = next_to_spinner(
        &ctx,
        "graph capture in global mode",
        move |ctx| -> Result<(), String> {
            let s = ctx.new_stream().map_err(|e| e.to_string())?;
            std::mem::forget(s.clone());
            // SAFETY: a stream of this context; global mode, as torch.cuda.graph.
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    s.cu_stream(),
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
                )
            }
            .result()
            .map_err(|e| format!("cuStreamBeginCapture: {e}"))?;
            cap2.store(true, SeqCst);
            let mut b = s.launch_builder(&f);
            b.arg(&out_ptr);
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: captured, not run; one pointer to memory never freed.
            unsafe { b.launch(cfg) }.map_err(|e| format!("captured launch: {e}"))?;
            // Keep capturing until the plugin thread is done (or gave up).
            let t0 = Instant::now();
            while !fin2.load(SeqCst) && t0.elapsed() < STEP_TIMEOUT + Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let mut g: sys::CUgraph = std::ptr::null_mut();
            // SAFETY: ends the capture begun above on this thread.
            let r = unsafe { sys::cuStreamEndCapture(s.cu_stream(), &mut g) };
            if r != sys::CUresult::CUDA_SUCCESS || g.is_null() {
                return Err(format!(
                    "the capture was invalidated while the plugin worked: cuStreamEndCapture gave {r:?}"
                ));
            }
            Ok(())
        },
        move || {
            let t0 = Instant::now();
            while !capturing.load(SeqCst) {
                if t0.elapsed() > Duration::from_secs(5) {
                    return Err("the capture never began".into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let r = plugin_moves_chunk(&c2, Dir::Send, max_wire);
            plugin_finished.store(true, SeqCst);
            r
        },
    );
    graph.expect("application's capture");
    chunk.check(13);
}

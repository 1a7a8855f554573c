//! The deadlock NCCL can hit through this plugin, provoked on purpose: NCCL's
//! kernel spins on the GPU until the plugin has moved its data, so nothing the
//! plugin does to move that data may wait for kernels of other streams.
//!
//! A stand-in for NCCL's kernel (a one-warp kernel spinning on a host-mapped flag)
//! runs on a non-blocking stream, with a second launch queued behind it (NCCL's
//! next kernel) and the legacy default stream waiting for both (PyTorch's compute
//! stream after `work.wait()`). While it spins, every CUDA step of the device data
//! path runs, in the order the plugin meets them: opening the device (module load,
//! `cuFuncLoad`, attributes), making lanes (pinned and device allocations, stream
//! creation: what `regMr` does while other comms' kernels run), then GPU encode,
//! GPU decode, download and upload on every lane's stream (16 streams: some share
//! a hardware queue with the spinner's), and allocations in between.
//!
//! Three more tests put the application's own hazards next to a spinning kernel
//! whose data a plugin thread must move (each fails if the plugin thread cannot
//! finish while the spinner waits for it):
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
//! The GPU tests of this binary run one at a time (a process-wide lock).
//!
//! A step that makes no progress for `STEP_TIMEOUT` waited for the spinner: the
//! test releases the spinner (so the process recovers), names the step, and fails.
//! Each step's duration is printed (costs under a co-running kernel). Prints
//! "SKIP: <reason>" and passes without a usable GPU. Worth running once more
//! with `CUDA_DEVICE_MAX_CONNECTIONS=1` (Megatron's setting: one hardware queue),
//! where a failure means the plugin cannot run under that setting.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
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

const STEP_TIMEOUT: Duration = Duration::from_secs(20);
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

/// What the worker has done, for the watchdog.
struct Progress {
    steps: AtomicUsize,
    current: Mutex<String>,
    finished: AtomicBool,
    log: Mutex<Vec<String>>,
}

impl Progress {
    fn step<T>(&self, name: &str, f: impl FnOnce() -> T) -> T {
        *self.current.lock().unwrap() = name.to_string();
        let t0 = Instant::now();
        let r = f();
        self.log
            .lock()
            .unwrap()
            .push(format!("{name}: {:?}", t0.elapsed()));
        self.steps.fetch_add(1, SeqCst);
        r
    }

    /// [`Progress::step`] for a fallible step: an error names its step.
    fn try_step<T, E: std::fmt::Display>(
        &self,
        name: &str,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, String> {
        self.step(name, f)
            .map_err(|e| format!("step '{name}' failed: {e}"))
    }
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

#[test]
fn data_path_never_waits_for_other_streams_kernels() {
    let Some((ctx, _gpu)) = context() else { return };
    // SAFETY: this test uses no CudaSlice.
    unsafe { ctx.disable_event_tracking() };
    let max_wire = codec::max_compressed_size(CHUNK);
    // Device buffers, filled before the spinner starts (synchronous copies on the
    // legacy stream would wait for it by design).
    let srcs: Vec<DeviceBuffer> = (0..LANES)
        .map(|i| {
            let b = DeviceBuffer::new(&ctx, CHUNK).unwrap();
            b.write(0, &data(i as u64, CHUNK)).unwrap();
            b
        })
        .collect();
    let dsts: Vec<DeviceBuffer> = (0..2 * LANES)
        .map(|_| {
            let b = DeviceBuffer::new(&ctx, CHUNK).unwrap();
            b.fill(0xEE).unwrap();
            b
        })
        .collect();
    let flag = MappedHost::new(&ctx, 64).unwrap();
    let spin_mod = ctx.load_module(Ptx::from_src(SPIN_PTX)).unwrap();
    let spin_fn = spin_mod.load_function("nzc_test_spin").unwrap();
    let spin = ctx.new_stream().unwrap();
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let flag_dev = flag.dev_ptr();
    for _ in 0..2 {
        let mut b = spin.launch_builder(&spin_fn);
        b.arg(&flag_dev);
        // SAFETY: one pointer argument, to host-mapped memory that outlives the launch.
        unsafe { b.launch(cfg) }.unwrap();
    }
    let ev = spin.record_event(None).unwrap();
    // SAFETY: the legacy stream of the current (primary) context waits for the event.
    unsafe { sys::cuStreamWaitEvent(std::ptr::null_mut(), ev.cu_event(), 0) }
        .result()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        // SAFETY: a plain query of a stream of this context.
        unsafe { sys::cuStreamQuery(spin.cu_stream()) },
        sys::CUresult::CUDA_ERROR_NOT_READY,
        "the spinner is not running"
    );

    let progress = Arc::new(Progress {
        steps: AtomicUsize::new(0),
        current: Mutex::new(String::new()),
        finished: AtomicBool::new(false),
        log: Mutex::new(Vec::new()),
    });
    let srcs = Arc::new(srcs);
    let dsts = Arc::new(dsts);
    let worker = {
        let (p, srcs, dsts, ctx) = (progress.clone(), srcs.clone(), dsts.clone(), ctx.clone());
        std::thread::spawn(move || -> Result<(), String> {
            static HELD: AtomicU64 = AtomicU64::new(0);
            let _finished = Finished(&p.finished);
            // Nothing this worker allocates is freed while the spinner runs: cuMemFree
            // and cuMemFreeHost wait for all device work, the spinner included, so a
            // drop here (also on an early `?` return) would read as a deadlock of the
            // step after it. Lanes (with their streams and memory) live for the
            // process, as in the plugin's pools; the two allocations below are leaked
            // (2 MiB) for the same reason.
            let b = p.try_step("open the device (module load, cuFuncLoad)", || {
                backend_for(srcs[0].ptr(), Emulation::Off)
            })?;
            eprintln!("backend: {}", b.describe());
            let mut lanes = ManuallyDrop::new(Vec::with_capacity(LANES));
            for i in 0..LANES {
                lanes.push(p.try_step(
                    &format!("make lane {i} (pinned + device memory, stream)"),
                    || b.lane(max_wire, &HELD),
                )?);
            }
            let opts = EncodeOptions::default();
            for (i, lane) in lanes.iter_mut().enumerate() {
                let (src, dst, dst2) = (srcs[i].ptr(), dsts[2 * i].ptr(), dsts[2 * i + 1].ptr());
                if lane.kernels() {
                    let n = p.try_step(&format!("lane {i}: GPU encode"), || {
                        lane.encode(src, CHUNK, &opts)
                    })?;
                    let m = p.try_step(&format!("lane {i}: GPU decode"), || {
                        lane.decode(n, dst, CHUNK)
                    })?;
                    if m != CHUNK {
                        return Err(format!(
                            "step 'lane {i}: GPU decode': decoded {m} bytes, not {CHUNK}"
                        ));
                    }
                } else {
                    p.try_step(&format!("lane {i}: upload (no kernels)"), || {
                        lane.download(src, CHUNK)?;
                        lane.upload(dst, CHUNK)
                    })?;
                }
                p.try_step(&format!("lane {i}: download"), || lane.download(src, CHUNK))?;
                p.try_step(&format!("lane {i}: upload"), || lane.upload(dst2, CHUNK))?;
            }
            // Allocations in between, each followed by lane work.
            let _d = p
                .try_step("cuMemAlloc", || DeviceBuffer::new(&ctx, 1 << 20))
                .map(ManuallyDrop::new)?;
            p.try_step("download after cuMemAlloc", || {
                lanes[0].download(srcs[0].ptr(), CHUNK)
            })?;
            let _h = p
                .try_step("cuMemHostAlloc", || MappedHost::new(&ctx, 1 << 20))
                .map(ManuallyDrop::new)?;
            p.try_step("download after cuMemHostAlloc", || {
                lanes[0].download(srcs[0].ptr(), CHUNK)
            })?;
            if lanes[0].kernels() {
                p.try_step("GPU encode after the allocations", || {
                    lanes[0].encode(srcs[0].ptr(), CHUNK, &opts)
                })?;
            }
            Ok(())
        })
    };

    // Watchdog: a step without progress for STEP_TIMEOUT waits for the spinner.
    let mut hung = None;
    let (mut last, mut since) = (0, Instant::now());
    while !progress.finished.load(SeqCst) {
        let now = progress.steps.load(SeqCst);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > STEP_TIMEOUT {
            hung = Some(progress.current.lock().unwrap().clone());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: a plain query of a stream of this context.
    let spinning = unsafe { sys::cuStreamQuery(spin.cu_stream()) };
    // Release the spinner (NCCL's kernel gets its data).
    // SAFETY: 4 bytes of the mapped allocation; the kernel only reads it.
    unsafe { std::ptr::write_volatile(flag.host_ptr() as *mut u32, 1) };
    let t0 = Instant::now();
    while !progress.finished.load(SeqCst) {
        if t0.elapsed() > AFTER_RELEASE {
            for l in progress.log.lock().unwrap().iter() {
                eprintln!("  {l}");
            }
            let step = progress.current.lock().unwrap().clone();
            let hung_note = match &hung {
                Some(_) => format!(
                    "made no progress in {STEP_TIMEOUT:?} while another stream's kernel \
                     spun (the plugin would deadlock NCCL there), and is "
                ),
                None => String::new(),
            };
            exit_now(&format!(
                "step '{step}' {hung_note}still stuck {AFTER_RELEASE:?} after the spinner \
                 was released"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let result = worker.join().unwrap_or_else(|_| {
        Err(format!(
            "worker panicked in step '{}'",
            progress.current.lock().unwrap()
        ))
    });
    for l in progress.log.lock().unwrap().iter() {
        eprintln!("  {l}");
    }
    spin.synchronize().unwrap();
    ctx.synchronize().unwrap();
    if let Some(step) = hung {
        panic!(
            "'{step}' made no progress in {STEP_TIMEOUT:?} while another stream's kernel spun: \
             the plugin would deadlock NCCL there"
        );
    }
    // An error first: a failed step can also be why the spinner stopped early.
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_eq!(
        spinning,
        sys::CUresult::CUDA_ERROR_NOT_READY,
        "the spinner stopped before it was released (the test proved nothing)"
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
        let m = ctx.load_module(Ptx::from_src(SPIN_PTX)).unwrap();
        let f = m.load_function("nzc_test_spin").unwrap();
        std::mem::forget(m);
        let stream = ctx.new_stream().unwrap();
        let flag_dev = flag.dev_ptr();
        let mut b = stream.launch_builder(&f);
        b.arg(&flag_dev);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one pointer argument, to host-mapped memory that is never freed.
        unsafe { b.launch(cfg) }.unwrap();
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
    let b = backend_for(c.src.ptr(), Emulation::Off).map_err(|e| format!("open: {e}"))?;
    let p = pool(&b, dir, max_wire, LANES);
    p.prewarm(1).map_err(|e| format!("prewarm (regMr): {e}"))?;
    let mut lane = p.acquire(&|| false).map_err(|e| format!("acquire: {e}"))?;
    let opts = EncodeOptions::default();
    if lane.kernels() {
        let n = lane
            .encode(c.src.ptr(), CHUNK, &opts)
            .map_err(|e| format!("GPU encode: {e}"))?;
        let m = lane
            .decode(n, c.dst.ptr(), CHUNK)
            .map_err(|e| format!("GPU decode: {e}"))?;
        if m != CHUNK {
            return Err(format!("GPU decode gave {m} bytes, not {CHUNK}"));
        }
    } else {
        lane.download(c.src.ptr(), CHUNK)
            .and_then(|_| lane.upload(c.dst.ptr(), CHUNK))
            .map_err(|e| format!("copies: {e}"))?;
    }
    lane.download(c.src.ptr(), CHUNK)
        .map_err(|e| format!("download: {e}"))?;
    lane.upload(c.dst2.ptr(), CHUNK)
        .map_err(|e| format!("upload: {e}"))?;
    Ok(())
}

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
         waited for its data: a deadlock inside a real job"
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

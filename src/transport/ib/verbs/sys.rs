//! Our own declarations of the few libibverbs types we use (rdma-core's
//! `<infiniband/verbs.h>`, x86-64/aarch64 LP64 ABI). Facts, not copied code:
//! every offset below was checked against rdma-core v44's header by compiling
//! `offsetof`/`sizeof` (see `LAYOUT` and tests/ib_layout.rs, which repeats the
//! check wherever the header is installed). The verbs ABI (`IBVERBS_1.1`) has been
//! stable since 2006; rdma-core only appends.
//!
//! Structures we only receive pointers to are declared as their leading fields
//! ("prefix") and never created or sized by us: `ibv_context` (the `ops` table),
//! `ibv_qp` (`context`, `qp_num`), `ibv_cq` (`context`), `ibv_mr` (keys).
//!
//! Inline verbs: `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are `static
//! inline` in verbs.h and call `qp->context->ops.post_send` (resp. `post_recv`,
//! `cq->context->ops.poll_cq`); they have no symbol to dlsym, so
//! [`super::safe`] makes the same indirect calls through [`ibv_context_ops`].
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

pub enum ibv_device {}
pub enum ibv_pd {}
pub enum ibv_comp_channel {}

pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers. We call entries 11 (poll_cq),
/// 25 (post_send) and 26 (post_recv); the rest are compat slots or unused.
#[repr(C)]
pub struct ibv_context_ops {
    _before_poll_cq: [*mut c_void; 11],
    pub poll_cq: Option<PollCqFn>,
    _between: [*mut c_void; 13],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    _after: [*mut c_void; 5],
}

/// Prefix of `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
}

/// Prefix of `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// Prefix of `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
}

/// Prefix of `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` with the `wr` union as its `rdma` member; the other
/// unions are padding we keep zeroed.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type_and_rest: [u64; 7],
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_device_attr`: we read only `phys_port_cnt` (byte 227).
#[repr(C)]
pub struct ibv_device_attr {
    raw: [u64; 29],
}

impl ibv_device_attr {
    pub fn zeroed() -> Self {
        ibv_device_attr { raw: [0; 29] }
    }
    pub fn phys_port_cnt(&self) -> u8 {
        // SAFETY: byte 227 of a 232-byte plain-data struct.
        unsafe { *(self as *const Self as *const u8).add(227) }
    }
}

#[repr(C, align(8))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

// Enum values (verbs.h).
pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_SEND_SIGNALED: u32 = 1 << 1;
pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_WC_LOC_PROT_ERR: u32 = 4;
pub const IBV_WC_WR_FLUSH_ERR: u32 = 5;
pub const IBV_WC_REM_ACCESS_ERR: u32 = 10;
pub const IBV_WC_RETRY_EXC_ERR: u32 = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: u32 = 13;
pub const IBV_WC_RDMA_WRITE: u32 = 1;
pub const IBV_WC_RECV_RDMA_WITH_IMM: u32 = 129;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

// Exported functions we dlsym (all in IBVERBS_1.1 except reg_dmabuf_mr, 1.12).
pub type GetDeviceListFn = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
pub type FreeDeviceListFn = unsafe extern "C" fn(*mut *mut ibv_device);
pub type GetDeviceNameFn = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
pub type OpenDeviceFn = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
pub type CloseDeviceFn = unsafe extern "C" fn(*mut ibv_context) -> c_int;
pub type QueryDeviceFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
/// The exported `ibv_query_port` fills the "compat" prefix of `ibv_port_attr`,
/// which holds every field up to `link_layer`; the caller zeroes the struct first
/// (as verbs.h's inline wrapper does).
pub type QueryPortFn = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
pub type QueryGidFn = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
pub type AllocPdFn = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
pub type DeallocPdFn = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
pub type RegMrFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
pub type RegDmabufMrFn =
    unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
pub type DeregMrFn = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
pub type CreateCqFn = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
pub type DestroyCqFn = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
pub type CreateQpFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
pub type ModifyQpFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
pub type DestroyQpFn = unsafe extern "C" fn(*mut ibv_qp) -> c_int;

/// (name, our value) for every layout fact we rely on; tests/ib_layout.rs compares
/// them with the C compiler's view of the installed verbs.h.
pub const LAYOUT: &[(&str, usize)] = &[
    (
        "ibv_context.ops.poll_cq",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq),
    ),
    (
        "ibv_context.ops.post_send",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
    ),
    (
        "ibv_context.ops.post_recv",
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv),
    ),
    ("ibv_qp.context", offset_of!(ibv_qp, context)),
    ("ibv_qp.qp_num", offset_of!(ibv_qp, qp_num)),
    ("ibv_cq.context", offset_of!(ibv_cq, context)),
    ("ibv_mr.lkey", offset_of!(ibv_mr, lkey)),
    ("ibv_mr.rkey", offset_of!(ibv_mr, rkey)),
    ("sizeof(ibv_sge)", size_of::<ibv_sge>()),
    ("sizeof(ibv_send_wr)", size_of::<ibv_send_wr>()),
    ("ibv_send_wr.imm_data", offset_of!(ibv_send_wr, imm_data)),
    (
        "ibv_send_wr.wr.rdma.remote_addr",
        offset_of!(ibv_send_wr, remote_addr),
    ),
    ("ibv_send_wr.wr.rdma.rkey", offset_of!(ibv_send_wr, rkey)),
    ("sizeof(ibv_recv_wr)", size_of::<ibv_recv_wr>()),
    ("sizeof(ibv_wc)", size_of::<ibv_wc>()),
    ("ibv_wc.byte_len", offset_of!(ibv_wc, byte_len)),
    ("ibv_wc.imm_data", offset_of!(ibv_wc, imm_data)),
    ("ibv_wc.qp_num", offset_of!(ibv_wc, qp_num)),
    ("ibv_wc.wc_flags", offset_of!(ibv_wc, wc_flags)),
    ("sizeof(ibv_port_attr)", size_of::<ibv_port_attr>()),
    ("ibv_port_attr.lid", offset_of!(ibv_port_attr, lid)),
    (
        "ibv_port_attr.active_width",
        offset_of!(ibv_port_attr, active_width),
    ),
    (
        "ibv_port_attr.active_speed",
        offset_of!(ibv_port_attr, active_speed),
    ),
    (
        "ibv_port_attr.link_layer",
        offset_of!(ibv_port_attr, link_layer),
    ),
    ("sizeof(ibv_device_attr)", size_of::<ibv_device_attr>()),
    ("sizeof(ibv_qp_init_attr)", size_of::<ibv_qp_init_attr>()),
    ("ibv_qp_init_attr.cap", offset_of!(ibv_qp_init_attr, cap)),
    (
        "ibv_qp_init_attr.qp_type",
        offset_of!(ibv_qp_init_attr, qp_type),
    ),
    ("sizeof(ibv_qp_attr)", size_of::<ibv_qp_attr>()),
    (
        "ibv_qp_attr.dest_qp_num",
        offset_of!(ibv_qp_attr, dest_qp_num),
    ),
    (
        "ibv_qp_attr.qp_access_flags",
        offset_of!(ibv_qp_attr, qp_access_flags),
    ),
    ("ibv_qp_attr.ah_attr", offset_of!(ibv_qp_attr, ah_attr)),
    (
        "ibv_qp_attr.pkey_index",
        offset_of!(ibv_qp_attr, pkey_index),
    ),
    (
        "ibv_qp_attr.max_rd_atomic",
        offset_of!(ibv_qp_attr, max_rd_atomic),
    ),
    ("ibv_qp_attr.port_num", offset_of!(ibv_qp_attr, port_num)),
    (
        "ibv_qp_attr.rate_limit",
        offset_of!(ibv_qp_attr, rate_limit),
    ),
    ("sizeof(ibv_ah_attr)", size_of::<ibv_ah_attr>()),
    ("ibv_ah_attr.dlid", offset_of!(ibv_ah_attr, dlid)),
    ("ibv_ah_attr.is_global", offset_of!(ibv_ah_attr, is_global)),
    (
        "ibv_global_route.flow_label",
        offset_of!(ibv_global_route, flow_label),
    ),
];

// The same facts, pinned at compile time (values from rdma-core v44's verbs.h, LP64).
const _: () = {
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq) == 96);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send) == 208);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv) == 216);
    assert!(size_of::<ibv_context_ops>() == 32 * 8);
    assert!(offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_mr, lkey) == 36 && offset_of!(ibv_mr, rkey) == 40);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, imm_data) == 36);
    assert!(offset_of!(ibv_send_wr, remote_addr) == 40 && offset_of!(ibv_send_wr, rkey) == 48);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_wc>() == 48 && offset_of!(ibv_wc, imm_data) == 24);
    assert!(size_of::<ibv_port_attr>() == 52 && offset_of!(ibv_port_attr, link_layer) == 46);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(size_of::<ibv_qp_init_attr>() == 64 && offset_of!(ibv_qp_init_attr, qp_type) == 52);
    assert!(size_of::<ibv_qp_attr>() == 144 && offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, port_num) == 129 && offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_ah_attr>() == 32 && offset_of!(ibv_ah_attr, dlid) == 24);
};

"""The quick tier (`python -m pytest -m quick`, docs/TESTS.md): cheap tests chosen among the suite's (measured
with --durations=0), under 3 minutes on 2 cores, that together touch every module of jaxdp/ and torch_ref/
(checked at the end of the run: tests/touched.py). The tier is this one table, so that choosing a test
for it edits no test file: {test file: "*" for all of its tests, or the names of the chosen tests (a
function's name takes all its parameters; `name[id]` one of them)}. `mark` gives them the marker `quick`.
"""
from __future__ import annotations

import pytest

ALL = "*"
QUICK = {
    # the house and the tests' own tree (not the two that start fresh interpreters: 50 s)
    "tests/house/test_house.py": (
        "test_no_import_cycle",
        "test_core_imports_no_framework",
        "test_torch_ref_takes_only_the_core_from_jaxdp",
        "test_only_the_harness_imports_torch_ref",
        "test_the_checker_sees_a_cycle_and_a_deferred_import",
        "test_the_layout_map_lists_every_module",
    ),
    "tests/house/test_tests_tree.py": ALL,
    "tests/house/test_docs_blocks.py": ALL,  # the docs' command blocks read only what an earlier block wrote
    "tests/house/test_docs_figures.py": (  # the docs' figures are their results files', links resolve (2 s)
        "test_every_figure_and_block_is_what_its_results_file_renders",
        "test_a_figure_that_differs_from_its_results_file_is_stale",
        "test_every_relative_link_resolves", "test_nothing_links_into_the_history",
        "test_a_page_says_how_things_are_now"),
    "tests/house/test_reruns.py": ALL,
    "tests/jaxdp/test_multiprocess.py": ("test_gloos_notice_is_dropped_in_any_of_its_pieces_and_nothing_else_is",
                                         "test_jaxs_sigterm_notice_is_dropped_from_a_processs_stderr_and_nothing_else_is"),
    "tests/cli/test_entry_points.py": ALL,
    "tests/cli/test_exit_status.py": ("test_the_mapping", "test_bad_flag_is_2_and_every_help_has_the_table"),
    "tests/cli/test_bad_input.py": (
        "test_readers_agree_with_the_strategies_own_option_tables",
        "test_shared_flags_mean_the_same_in_both_frameworks",
    ),
    "tests/cli/test_processes_trust.py": (
        "test_a_taken_port_is_refused",
        "test_a_killed_launcher_leaves_no_worker_and_listens_on_loopback[jaxdp]",
    ),
    "tests/torch_ref/canonical/test_torch_segments.py": ALL,  # canonical BatchNorm by segments, 3 s
    "tests/jaxdp/harness/bench/test_inspect_child.py": ALL,  # the compile child dies with the bench, 2 s
    "tests/jaxdp/harness/bench/test_bench_canonical.py": ALL,
    "tests/jaxdp/harness/bench/test_plan.py": ALL,
    # jaxdp.core: numpy only, synthetic traces
    "tests/jaxdp/core/traces/test_data_and_trace.py": (
        "test_trace_round_trip_and_layout",
        "test_truncated_trace_is_refused",
        "test_non_finite_is_never_agreement",
        "test_elementwise_error_sees_a_small_element_that_the_relative_error_hides",
        "test_ulp_distance_counts_representable_values_in_the_arrays_own_type",
        "test_updates_are_each_steps_parameter_change_and_a_wrong_step_shows_in_it",
        "test_the_bit_for_bit_helper_refuses_identical_nans",
    ),
    "tests/jaxdp/core/traces/test_hostile_traces.py": ALL,
    "tests/jaxdp/core/traces/test_recorder.py": ALL,
    "tests/jaxdp/core/traces/test_census.py": ALL,  # the precision census's shape, 1 s
    "tests/jaxdp/test_precision.py": ("test_a_named_scope_names_the_site",),
    "tests/torch_ref/test_precision.py": (
        "test_a_float32_upcast_in_a_plain_module_is_a_site_and_keep_float64_removes_it",),
    "tests/mutations/test_precision_limits.py": ALL,
    "tests/jaxdp/judge/test_precision.py": ("test_the_bounds_follow_the_lowest_site_and_never_loosen_without_one",),
    "tests/jaxdp/core/run/test_reduction.py": ALL,
    "tests/jaxdp/core/traces/test_spread.py": ALL,
    "tests/jaxdp/core/memory/test_sizes.py": (  # and sizes checked before work, in both CLIs (in-process, 17 s)
        "test_the_parameter_count_is_the_models_own", "test_the_shards_table_is_the_strategies_layouts",
        "test_each_part_is_laid_out_as_the_strategy_shards_it", "test_human_sizes",
        "test_the_machine_is_read_without_a_framework", "test_an_unknown_memory_skips_the_check_and_force_skips_both",
        "test_a_cluster_host_holds_its_share"),
    "tests/jaxdp/core/files/test_paths.py": ALL,
    "tests/jaxdp/core/files/test_regular.py": (  # devices, FIFOs and sockets never read, 1 s
        "test_kind_names_what_a_path_is", "test_input_file_refuses_what_is_not_a_regular_file",
        "test_open_regular_refuses_without_blocking", "test_open_regular_refuses_a_fifo_swapped_in_after_the_stat",
        "test_trace_load_refuses_a_fifo_or_device", "test_jaxdp_diff_refuses_in_one_line_status_2_within_a_second"),
    "tests/jaxdp/core/files/test_disk_full.py": (  # a full disk in every shape a library raises it, 1 s
        "test_find_sees_a_full_disk_in_every_shape_a_library_raises", "test_find_leaves_other_errors_alone",
        "test_an_unnamed_write_error_is_named_by_the_file_it_was_writing",
        "test_last_words_go_to_the_launcher_or_nowhere",
        "test_a_failed_write_on_a_disk_without_room_is_a_full_disk", "test_a_full_disk_writing_diffs_json_is_one_line"),
    "tests/jaxdp/core/files/test_nofollow.py": ALL,  # links in the checkpoint folder, on a hand-made folder, 2 s
    "tests/jaxdp/core/files/test_manifest_key.py": ALL,  # the manifest's MAC under the user's key, 1 s
    "tests/jaxdp/core/process/test_xla_flags.py": ALL,
    "tests/jaxdp/core/process/test_stop.py": (  # in this process (the real runs: 3 min)
        "test_stopped_is_an_interrupt_with_the_shells_status",
        "test_a_signal_in_a_loop_waits_for_the_steps_end_and_a_second_does_not",
        "test_a_command_answers_sigterm_with_its_line_and_143",
    ),
    "tests/torch_ref/test_stop_agreement.py": ALL,
    "tests/cli/test_sizes_checked.py": ALL,
    "tests/jaxdp/harness/test_interrupt.py": ("test_children_leave_ctrl_c_to_this_process_which_keeps_it",
                                              "test_a_closed_pipe_ends_the_command_quietly"),
    # jaxdp: the library API on three strategies; every strategy's compiled step (the non-finite check)
    "tests/jaxdp/test_api.py": (
        "test_every_step_equals_the_independent_reference[ddp-x2-accum3]",
        "test_every_step_equals_the_independent_reference[zero2-x2-accum1]",
        "test_every_step_equals_the_independent_reference[fsdp-x2-accum3]",
        "test_bad_arguments_are_one_line_naming_the_fix",
        "test_bad_batches_and_losses_fail_before_compiling",
        "test_canonical_on_cpu_needs_fma_off_and_a_fixed_thread_pool",
    ),
    "tests/jaxdp/strategies/test_nonfinite.py": ("test_every_strategy_flags_a_nonfinite_gradient_with_a_finite_loss",),
    "tests/jaxdp/strategies/jit/test_jit.py": ("test_axis_type_is_refused_for_a_hand_written_strategy",),
    "tests/jaxdp/strategies/test_hsdp.py": (
        "test_bad_replicas_is_one_line_in_both_frameworks",
        "test_library_refuses_replicas_that_do_not_divide_and_other_strategies",
    ),
    "tests/jaxdp/strategies/zero/test_zero_layout.py": ALL,
    "tests/jaxdp/models/test_dot_fold.py": ALL,  # canonical's folded weight-gradient products (3 s)
    "tests/jaxdp/test_collectives.py": (
        "test_pack_is_concatenate_and_pad_and_unpack_inverts_it",
        "test_collectives_benchmark_runs_every_op_size_and_n",
    ),
    "tests/jaxdp/test_checkpoint.py": ("test_missing_and_corrupt_checkpoints",),
    "tests/jaxdp/canonical/test_canonical.py": ("test_bad_input_is_one_line_naming_the_fix",),
    "tests/jaxdp/canonical/test_definition.py": ALL,
    "tests/jaxdp/test_devices.py": ALL,
    "tests/jaxdp/test_public_paths.py": ALL,
    "tests/jaxdp/analysis/test_hlo.py": (
        "test_trips_multiply_through_nested_loops",
        "test_communication_counts_every_iteration",
        "test_replica_groups_explicit_iota_and_permute_pairs",
    ),
    "tests/jaxdp/analysis/test_inspect.py": ("test_inspect_ddp_bucket_lists_one_all_reduce_per_bucket_and_the_plan",),
    # --target (docs/GPU.md): two small steps compiled by XLA:GPU (12 s) and the schedule reader on hand-written HLO
    "tests/jaxdp/analysis/test_gpu_target.py": ALL,
    "tests/jaxdp/analysis/test_fusion_reads.py": ALL,
    "tests/jaxdp/core/run/test_targets.py": ALL,
    "tests/jaxdp/harness/bench/test_gpu_target.py": ALL,
    "tests/jaxdp/models/test_gpt2.py": ("test_bad_gpt2_flags_name_the_fix",),
    "tests/jaxdp/models/test_llama.py": (
        "test_jaxdp_equals_its_torch_twin_in_float64",
        "test_bad_llama_flags_name_the_fix",
        "test_logits_equal_transformers_to_1e_12_with_its_float32_sites_in_float64",
        "test_units_are_the_embedding_each_layer_and_the_head_in_both_frameworks",
    ),
    "tests/jaxdp/models/test_cnn.py": ("test_bad_cnn_config_is_one_line",),
    "tests/jaxdp/models/test_loop_conv.py": ("test_its_gradient_is_the_convolutions_gradient",
                                             "test_the_hook_is_lax_outside_canonical_batchnorm"),
    "tests/jaxdp/judge/test_divergence.py": ALL,
    "tests/jaxdp/judge/test_decay_split.py": ALL,  # the judge's coupled-decay term, both ways (9 s)
    "tests/jaxdp/judge/test_common_scale.py": ALL,  # the judge's common factor, weighted, both ways (0.1 s)
    "tests/jaxdp/judge/test_error_model.py": ALL,
    "tests/jaxdp/judge/test_diff_api.py": ALL,
    "tests/jaxdp/harness/test_cli.py": (
        "test_unknown_names_list_the_valid_ones",
        "test_corrupt_and_missing_traces",
        "test_batch_that_does_not_divide_names_valid_sizes",
    ),
    "tests/mutations/test_catalogue.py": ALL,
    "tests/mutations/test_mutations.py": ("test_replica_check_catches_a_device_that_skips_weight_decay",),
    "tests/jaxdp/harness/report/test_recommend.py": (
        "test_overflow_sees_a_cut_title_and_a_legend_over_the_data",
        "test_the_pick_follows_the_measured_state",
        "test_the_page_prints_units_not_raw_floats",
        "test_least_traffic_among_those_that_fit_and_measured_hsdp_is_not_projected",
        "test_a_measured_hsdp_is_zero3_on_one_node_and_measured_across_nodes",
        "test_the_jit_forms_hold_their_own_layouts",
        "test_one_device_projects_from_the_theory_and_single_gives_no_cluster_advice",
        "test_no_note_is_said_twice",
    ),
    "tests/jaxdp/harness/report/test_compare.py": (
        "test_reference_parameter_counts_exactly",
        "test_toy_model_is_not_projected",
        "test_criterion_boundary_is_compute_equal_to_communication",
        "test_compare_refuses_a_strategy_one_framework_lacks",
        "test_local_batchnorm_is_a_finding_next_to_the_verdict_not_a_failure",  # the runner's own function
    ),
    # torch_ref in this process (a world of one)
    "tests/torch_ref/strategies/test_world_of_one.py": ALL,
    "tests/torch_ref/test_torch_api.py": (
        "test_a_wrong_step_is_caught",
        "test_bad_input_is_one_line_naming_the_fix",
        "test_gradients_are_kept_only_while_a_recorder_is_attached",
        "test_recorder_names_override_the_automatic_mapping",
    ),
    "tests/torch_ref/test_torch_batchnorm.py": (
        "test_convert_carries_every_setting_and_the_same_tensors",
        "test_a_converted_layer_is_torchs_in_a_world_of_one",
        "test_convert_refuses_in_one_line",
        "test_canonical_reduction_takes_a_converted_model",
    ),
    "tests/torch_ref/test_convert.py": (
        "test_each_layer_computes_as_the_nnx_layer",
        "test_every_mismatch_is_listed_in_one_error",
    ),
    "tests/torch_ref/models/test_torch_models.py": (
        "test_parameters_order_is_the_flax_definition_order",
        "test_torch_single_equals_jax_single_in_float64[mlp]",
    ),
    "tests/torch_ref/analysis/test_torch_profiler.py": ALL,
    "tests/torch_ref/analysis/test_canonical_cost.py": ALL,
    "tests/torch_ref/models/test_torch_shared.py": (
        "test_default_units_of_model_library_models_are_their_decoder_layers",
        "test_default_units_leave_shared_parameters_to_the_root",
        "test_units_that_split_a_shared_parameter_are_one_line",
    ),
    "tests/torch_ref/canonical/test_torch_canonical.py": (
        "test_tree_pairs_adjacent_leaves_level_by_level_and_folds_fold_in_order",
        "test_folds_add_the_tree_as_shards_finish_into_their_own_buffers",
        "test_canonical_norm_is_the_definition",
        "test_default_shards",
        "test_optimizer_update_on_a_shard_is_the_full_tensor_update",
        "test_api_refuses_unknown_reductions_and_batchnorm",
    ),
    "tests/torch_ref/test_torch_checkpoint.py": ("test_cli_reports_checkpoint_errors_in_one_line",),
    # a world of two from the fork server (torch_ref.fork_context, torch_ref.rank_server), in a child process
    "tests/torch_ref/test_torch_launch.py": ("test_ranks_start_with_what_every_rank_imports_already_imported",
                                             "test_the_fork_server_imports_transformers_when_the_launcher_has"),
}


def chosen(nodeid: str, name: str, originalname: str) -> bool:
    path = nodeid.split("::", 1)[0]
    names = QUICK.get(path)
    return names == ALL or (names is not None and (name in names or originalname in names))


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers
def pytest_collection_modifyitems(items):
    """Give the chosen tests the `quick` marker."""
    for item in items:
        if chosen(item.nodeid, item.name, getattr(item, "originalname", item.name)):
            item.add_marker(pytest.mark.quick)

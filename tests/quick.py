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
    # the house and the tests' own tree
    "tests/house/test_house.py": ALL,
    "tests/house/test_tests_tree.py": ALL,
    # jaxdp.core: pure numpy, synthetic traces
    "tests/jaxdp/core/test_data_and_trace.py": ALL,
    "tests/jaxdp/core/test_hostile_traces.py": ALL,
    "tests/jaxdp/core/test_recorder.py": ALL,
    "tests/jaxdp/core/test_spread.py": ALL,
    # the library API: every hand-written strategy at N = 2 (one compile each), the errors before compiling
    "tests/jaxdp/test_api.py": ("test_every_step_equals_the_independent_reference[dp-x2-accum1]",
                                "test_every_step_equals_the_independent_reference[ddp-x2-accum3]",
                                "test_every_step_equals_the_independent_reference[ddp-pmap-x2-accum1]",
                                "test_every_step_equals_the_independent_reference[ddp-bucket-x2-accum3]",
                                "test_every_step_equals_the_independent_reference[ddp-ring-x2-accum1]",
                                "test_every_step_equals_the_independent_reference[zero1-x2-accum3]",
                                "test_every_step_equals_the_independent_reference[zero2-x2-accum1]",
                                "test_every_step_equals_the_independent_reference[fsdp-x2-accum3]",
                                "test_every_step_equals_the_independent_reference[single-x1-accum3]",
                                "test_bad_arguments_are_one_line_naming_the_fix",
                                "test_bad_batches_and_losses_fail_before_compiling",
                                "test_a_shape_dependent_optimizer_is_named_under_zero_and_accepted_elsewhere",
                                "test_unit_specs_sharing_a_parameter_inconsistently_are_one_line"),
    "tests/jaxdp/strategies/test_nonfinite.py": ("test_every_strategy_flags_a_nonfinite_gradient_with_a_finite_loss",),
    "tests/jaxdp/strategies/jit/test_jit.py": ("test_axis_type_is_refused_for_a_hand_written_strategy",
                                               "test_jaxdp_memory_reads_the_jit_strategies"),
    "tests/jaxdp/strategies/test_hsdp.py": ("test_bad_replicas_is_one_line_in_both_frameworks",
                                            "test_library_refuses_replicas_that_do_not_divide_and_other_strategies",
                                            "test_state_per_device_is_zero3s_at_s"),
    "tests/jaxdp/strategies/zero/test_zero_layout.py": ALL,
    "tests/jaxdp/test_collectives.py": ("test_pack_is_concatenate_and_pad_and_unpack_inverts_it",
                                        "test_collectives_benchmark_runs_every_op_size_and_n"),
    "tests/jaxdp/test_checkpoint.py": ("test_missing_and_corrupt_checkpoints", "test_checkpoint_of_another_config_names_the_mismatch"),
    "tests/jaxdp/canonical/test_canonical.py": ("test_layout_refuses_a_batchnorm_it_cannot_give_statistics_to",
                                                "test_bad_input_is_one_line_naming_the_fix"),
    "tests/jaxdp/analysis/test_hlo.py": ALL,
    "tests/jaxdp/analysis/test_inspect.py": ALL,
    "tests/jaxdp/models/test_gpt2.py": ("test_names_are_gpt2s_and_the_head_is_the_token_embedding",
                                        "test_bad_gpt2_flags_name_the_fix", "test_124m_parameter_count_counts_the_tied_weight_once"),
    "tests/jaxdp/models/test_llama.py": ("test_jaxdp_equals_its_torch_twin_in_float64", "test_bad_llama_flags_name_the_fix",
                                         "test_units_are_the_embedding_each_layer_and_the_head_in_both_frameworks",
                                         "test_parameter_count_formula_equals_the_models"),
    "tests/jaxdp/models/test_cnn.py": ("test_bad_cnn_config_is_one_line",),
    "tests/jaxdp/harness/test_divergence.py": ALL,
    "tests/jaxdp/harness/test_error_model.py": ALL,
    "tests/jaxdp/harness/test_diff_api.py": ALL,
    "tests/jaxdp/harness/test_cli.py": ("test_unknown_names_list_the_valid_ones", "test_batch_that_does_not_divide_names_valid_sizes",
                                        "test_corrupt_and_missing_traces", "test_diff_refuses_traces_of_different_configs"),
    "tests/jaxdp/harness/report/test_recommend.py": ALL,
    "tests/jaxdp/harness/report/test_compare.py": ("test_reference_parameter_counts_exactly", "test_toy_model_is_not_projected",
                                                   "test_criterion_boundary_is_compute_equal_to_communication",
                                                   "test_compare_refuses_a_strategy_one_framework_lacks"),
    "tests/cli/test_exit_status.py": ("test_the_mapping", "test_bad_flag_is_2_and_every_help_has_the_table"),
    "tests/cli/test_bad_input.py": ("test_readers_agree_with_the_strategies_own_option_tables",
                                    "test_shared_flags_mean_the_same_in_both_frameworks"),
    # torch_ref in this process (a world of one at most)
    "tests/torch_ref/test_torch_api.py": ("test_a_wrong_step_is_caught", "test_gradients_are_kept_only_while_a_recorder_is_attached",
                                          "test_recorder_names_override_the_automatic_mapping",
                                          "test_bad_input_is_one_line_naming_the_fix"),
    "tests/torch_ref/test_torch_batchnorm.py": ("test_convert_carries_every_setting_and_the_same_tensors",
                                                "test_a_converted_layer_is_torchs_in_a_world_of_one",
                                                "test_convert_refuses_in_one_line", "test_canonical_reduction_takes_a_converted_model"),
    "tests/torch_ref/test_convert.py": ("test_each_layer_computes_as_the_nnx_layer", "test_every_mismatch_is_listed_in_one_error",
                                        "test_builtin_models_map_as_the_flax_models"),
    "tests/torch_ref/models/test_torch_models.py": ALL,
    "tests/torch_ref/analysis/test_torch_profiler.py": ALL,
    "tests/torch_ref/canonical/test_torch_canonical.py": ("test_tree_pairs_adjacent_leaves_level_by_level_and_folds_fold_in_order",
                                                          "test_canonical_norm_is_the_definition", "test_default_shards",
                                                          "test_optimizer_update_on_a_shard_is_the_full_tensor_update",
                                                          "test_api_refuses_unknown_reductions_and_batchnorm"),
    "tests/torch_ref/test_torch_checkpoint.py": ("test_a_torn_checkpoint_is_never_loaded",
                                                 "test_cli_reports_checkpoint_errors_in_one_line"),
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

"""ament_python package oxygen_ros: pi0.5 with OxyGen unified KV cache management on ROS 2."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = 'oxygen_ros'

setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(include=[PACKAGE, f'{PACKAGE}.*']),
    # the declaration of every parameter, read at import (oxygen_ros/parameters/__init__.py)
    package_data={f'{PACKAGE}.parameters': ['oxygen_parameters.yaml']},
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
        (f'share/{PACKAGE}/launch', glob('launch/*.launch.py')),
        (f'share/{PACKAGE}/config', glob('config/*.yaml') + glob('config/*.xml')
         + glob('config/*.json')),
    ],
    python_requires='>=3.11',
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='oxygen_ros maintainers',
    maintainer_email='maintainers@users.noreply.a-seed-0a1f5226.example',
    description='pi0.5 VLA on ROS 2 with OxyGen unified KV cache management',
    license='Apache-2.0',
    # `pip install .[convert]`: oxygen_convert's orbax reader (requirements/convert.txt).
    extras_require={'test': ['pytest'], 'convert': ['tensorstore>=0.1.60']},
    entry_points={
        'console_scripts': [
            # One executable per thing a user does (snake_case, as `ros2 run` expects); the
            # groups take subcommands (`oxygen_bench engine --help`), see docs/tools.md.
            'oxygen_node = oxygen_ros.ros.node:main',
            'oxygen_sim = oxygen_ros.sim.app:main',
            'oxygen_serve = oxygen_ros.serve.app:main',
            'oxygen_ask = oxygen_ros.tools.ask:main',
            'oxygen_demo = oxygen_ros.tools.demo:main',
            'oxygen_bag = oxygen_ros.tools.bag:main',
            'oxygen_bench = oxygen_ros.tools.bench:main',
            'oxygen_stress = oxygen_ros.tools.stress:main',
            'oxygen_fetch = oxygen_ros.tools.fetch:main',
            'oxygen_export = oxygen_ros.tools.export:main',
            'oxygen_convert = oxygen_ros.tools.convert:main',
            'oxygen_keystore = oxygen_ros.tools.keystore:main',
            'oxygen_run_model = oxygen_ros.tools.run_model:main',
            'oxygen_doctor = oxygen_ros.tools.doctor:main',
        ],
        # Backends beyond torch, by the `backend` parameter's value (backends/factory.py):
        # the experimental TensorRT backend lives with oxygen_export, outside the runtime.
        'oxygen_ros.backends': [
            'tensorrt = oxygen_ros.tools.tensorrt.tensorrt_backend:create_backend',
        ],
    },
)
